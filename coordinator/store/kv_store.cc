#include "coordinator/store/kv_store.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace trainstep {

absl::Status KvStore::CheckRoom(const std::string& key, size_t value_bytes) const {
  auto it = values_.find(key);
  const bool fresh = it == values_.end();
  if (fresh && max_keys_ > 0 && size() >= max_keys_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the job's key-value store holds ", size(), " keys, the limit (--store-max-keys ",
        max_keys_, "); key \"", key.substr(0, 64), "\" refused"));
  }
  const int64_t after =
      bytes_ + static_cast<int64_t>(value_bytes) +
      (fresh ? static_cast<int64_t>(key.size()) : -static_cast<int64_t>(it->second.size()));
  if (max_bytes_ > 0 && after > max_bytes_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the job's key-value store would hold ", after, " bytes with key \"",
                     key.substr(0, 64), "\"; the limit is ", max_bytes_, " (--store-max-bytes)"));
  }
  return absl::OkStatus();
}

void KvStore::Put(const std::string& key, std::string value) {
  auto [it, fresh] = values_.try_emplace(key);
  bytes_ += static_cast<int64_t>(value.size()) - static_cast<int64_t>(it->second.size()) +
            (fresh ? static_cast<int64_t>(key.size()) : 0);
  it->second = std::move(value);
  ++version_;
}

absl::Status KvStore::Set(const std::string& key, std::string value) {
  RETURN_IF_ERROR(CheckRoom(key, value.size()));
  Put(key, std::move(value));
  return absl::OkStatus();
}

std::optional<std::string> KvStore::Get(const std::string& key) const {
  auto it = values_.find(key);
  if (it == values_.end()) return std::nullopt;
  return it->second;
}

absl::StatusOr<int64_t> KvStore::Add(const std::string& key, int64_t delta) {
  int64_t value = 0;
  auto it = values_.find(key);
  if (it != values_.end() && !absl::SimpleAtoi(it->second, &value)) {
    return absl::FailedPreconditionError(
        absl::StrCat("store key \"", key, "\" holds a non-integer value; add() needs an integer"));
  }
  const int64_t before = value;
  if (__builtin_add_overflow(before, delta, &value)) {
    // c10d counters never get near this; wrapping would hand out a counter value twice.
    return absl::OutOfRangeError(absl::StrCat("store key \"", key, "\": add(", delta,
                                              ") would take its value past the int64 range "
                                              "(-2^63 .. 2^63-1); the value stays ",
                                              before));
  }
  std::string text = absl::StrCat(value);
  RETURN_IF_ERROR(CheckRoom(key, text.size()));
  Put(key, std::move(text));
  return value;
}

absl::StatusOr<std::string> KvStore::CompareSet(const std::string& key, const std::string& expected,
                                                std::string desired) {
  auto it = values_.find(key);
  if (it == values_.end()) {
    if (!expected.empty()) return expected;  // c10d: missing key and non-empty expected
  } else if (it->second != expected) {
    return it->second;
  }
  RETURN_IF_ERROR(CheckRoom(key, desired.size()));
  Put(key, desired);
  return desired;
}

bool KvStore::HasAll(const std::vector<std::string>& keys) const {
  for (const std::string& k : keys) {
    if (values_.count(k) == 0) return false;
  }
  return true;
}

bool KvStore::Delete(const std::string& key) {
  auto it = values_.find(key);
  if (it == values_.end()) return false;
  bytes_ -= static_cast<int64_t>(it->first.size() + it->second.size());
  values_.erase(it);
  ++version_;
  return true;
}

void KvStore::KeepOnly(const std::string& prefix) {
  for (auto it = values_.begin(); it != values_.end();) {
    if (absl::StartsWith(it->first, prefix)) {
      ++it;
      continue;
    }
    bytes_ -= static_cast<int64_t>(it->first.size() + it->second.size());
    it = values_.erase(it);
  }
}

}  // namespace trainstep
