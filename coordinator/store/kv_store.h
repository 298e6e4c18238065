// The key-value store workers rendezvous their collective through (c10d::Store semantics:
// add() keeps a decimal integer as the value). In memory only: a rendezvous belongs to
// one generation and is redone after a coordinator restart. Bounded in keys and bytes (a job's
// store must not grow the coordinator without limit). Not thread-safe.
#ifndef TRAINSTEP_COORDINATOR_STORE_KV_STORE_H_
#define TRAINSTEP_COORDINATOR_STORE_KV_STORE_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace trainstep {

class KvStore {
 public:
  KvStore() = default;
  // Limits on the number of keys and on the bytes of keys plus values; 0 = unlimited. The
  // flags that set them are named when a write is refused.
  KvStore(int64_t max_keys, int64_t max_bytes) : max_keys_(max_keys), max_bytes_(max_bytes) {}

  // Every write fails with RESOURCE_EXHAUSTED (naming the limit) when it would take the store
  // past a limit, and then changes nothing.
  absl::Status Set(const std::string& key, std::string value);
  std::optional<std::string> Get(const std::string& key) const;
  // c10d add(): the value is a decimal integer; a missing key counts as 0.
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta);
  // c10d compareSet(): sets `desired` if the current value is `expected` (or the key is
  // missing and `expected` is empty); returns the value now stored.
  absl::StatusOr<std::string> CompareSet(const std::string& key, const std::string& expected,
                                         std::string desired);
  bool HasAll(const std::vector<std::string>& keys) const;
  bool Delete(const std::string& key);
  int64_t size() const { return static_cast<int64_t>(values_.size()); }
  int64_t bytes() const { return bytes_; }
  // Drops every key outside `prefix` (a finished generation's rendezvous).
  void KeepOnly(const std::string& prefix);
  uint64_t version() const { return version_; }

 private:
  // OK if `key` may hold a value of `value_bytes` bytes within the limits.
  absl::Status CheckRoom(const std::string& key, size_t value_bytes) const;
  // Stores `value` under `key`, keeping bytes_ and version_ (after CheckRoom).
  void Put(const std::string& key, std::string value);

  int64_t max_keys_ = 0;
  int64_t max_bytes_ = 0;
  std::map<std::string, std::string> values_;
  int64_t bytes_ = 0;  // the sum of every key's and value's size
  uint64_t version_ = 0;
};

}  // namespace trainstep

#endif  // TRAINSTEP_COORDINATOR_STORE_KV_STORE_H_
