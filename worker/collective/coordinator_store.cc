#include "worker/collective/coordinator_store.h"

#include <c10/util/Exception.h>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace trainstep {
namespace {

absl::Duration ToAbsl(std::chrono::milliseconds ms) { return absl::Milliseconds(ms.count()); }

std::string ToString(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }
std::vector<uint8_t> ToBytes(const std::string& s) {
  return std::vector<uint8_t>(s.begin(), s.end());
}

template <typename T>
T OrThrow(absl::StatusOr<T> r, const std::string& what) {
  TORCH_CHECK(r.ok(), "coordinator store ", what, ": ", std::string(r.status().message()));
  return std::move(*r);
}

}  // namespace

CoordinatorStore::CoordinatorStore(std::shared_ptr<WorkerRpc> client, StoreScope scope,
                                   std::chrono::milliseconds timeout)
    : c10d::Store(timeout), client_(std::move(client)), scope_(std::move(scope)) {}

void CoordinatorStore::set(const std::string& key, const std::vector<uint8_t>& value) {
  absl::Status s = client_->StoreSet(scope_, key, ToString(value));
  TORCH_CHECK(s.ok(), "coordinator store set ", key, ": ", std::string(s.message()));
}

std::vector<uint8_t> CoordinatorStore::compareSet(const std::string& key,
                                                  const std::vector<uint8_t>& expected,
                                                  const std::vector<uint8_t>& desired) {
  return ToBytes(
      OrThrow(client_->StoreCompareSet(scope_, key, ToString(expected), ToString(desired)),
              "compareSet " + key));
}

std::vector<uint8_t> CoordinatorStore::get(const std::string& key) {
  return ToBytes(OrThrow(client_->StoreGet(scope_, key, ToAbsl(timeout_)), "get " + key));
}

int64_t CoordinatorStore::add(const std::string& key, int64_t value) {
  return OrThrow(client_->StoreAdd(scope_, key, value), "add " + key);
}

bool CoordinatorStore::deleteKey(const std::string& key) {
  return OrThrow(client_->StoreDeleteKey(scope_, key), "deleteKey " + key);
}

bool CoordinatorStore::check(const std::vector<std::string>& keys) {
  return OrThrow(client_->StoreCheck(scope_, keys), "check");
}

int64_t CoordinatorStore::getNumKeys() {
  return OrThrow(client_->StoreNumKeys(scope_), "getNumKeys");
}

void CoordinatorStore::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void CoordinatorStore::wait(const std::vector<std::string>& keys,
                            const std::chrono::milliseconds& timeout) {
  absl::Status s = client_->StoreWait(scope_, keys, ToAbsl(timeout));
  TORCH_CHECK(s.ok(), "coordinator store wait: ", std::string(s.message()));
}

}  // namespace trainstep
