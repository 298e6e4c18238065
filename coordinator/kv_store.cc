#include "coordinator/kv_store.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace trainstep {

void KvStore::Set(const std::string& key, std::string value) {
  values_[key] = std::move(value);
  ++version_;
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
  values_[key] = absl::StrCat(value);
  ++version_;
  return value;
}

std::string KvStore::CompareSet(const std::string& key, const std::string& expected,
                                std::string desired) {
  auto it = values_.find(key);
  if (it == values_.end()) {
    if (!expected.empty()) return expected;  // c10d: missing key and non-empty expected
    values_[key] = desired;
    ++version_;
    return desired;
  }
  if (it->second == expected) {
    it->second = std::move(desired);
    ++version_;
  }
  return it->second;
}

bool KvStore::HasAll(const std::vector<std::string>& keys) const {
  for (const std::string& k : keys) {
    if (values_.count(k) == 0) return false;
  }
  return true;
}

bool KvStore::Delete(const std::string& key) {
  const bool erased = values_.erase(key) > 0;
  if (erased) ++version_;
  return erased;
}

void KvStore::KeepOnly(const std::string& prefix) {
  for (auto it = values_.begin(); it != values_.end();) {
    it = absl::StartsWith(it->first, prefix) ? std::next(it) : values_.erase(it);
  }
}

}  // namespace trainstep
