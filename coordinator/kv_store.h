// The key-value store workers rendezvous their collective through (c10d::Store semantics:
// add() keeps a decimal integer as the value). In memory only: a rendezvous belongs to
// one generation and is redone after a coordinator restart. Not thread-safe.
#ifndef TRAINSTEP_COORDINATOR_KV_STORE_H_
#define TRAINSTEP_COORDINATOR_KV_STORE_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace trainstep {

class KvStore {
 public:
  void Set(const std::string& key, std::string value);
  std::optional<std::string> Get(const std::string& key) const;
  // c10d add(): the value is a decimal integer; a missing key counts as 0.
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta);
  // c10d compareSet(): sets `desired` if the current value is `expected` (or the key is
  // missing and `expected` is empty); returns the value now stored.
  std::string CompareSet(const std::string& key, const std::string& expected, std::string desired);
  bool HasAll(const std::vector<std::string>& keys) const;
  bool Delete(const std::string& key);
  int64_t size() const { return static_cast<int64_t>(values_.size()); }
  // Drops every key outside `prefix` (a finished generation's rendezvous).
  void KeepOnly(const std::string& prefix);
  uint64_t version() const { return version_; }

 private:
  std::map<std::string, std::string> values_;
  uint64_t version_ = 0;
};

}  // namespace trainstep

#endif  // TRAINSTEP_COORDINATOR_KV_STORE_H_
