// A c10d::Store whose keys live on the coordinator (WorkerService Store* calls), so the
// workers' collective rendezvouses through the service they already talk to: no extra
// TCPStore port, and a new generation gets a fresh key namespace.
#ifndef TRAINSTEP_WORKER_COLLECTIVE_COORDINATOR_STORE_H_
#define TRAINSTEP_WORKER_COLLECTIVE_COORDINATOR_STORE_H_

#include <memory>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

#include "worker/link/worker_client.h"

namespace trainstep {

// c10d calls it from its own threads; WorkerClient is thread-safe. Errors are thrown as
// c10::Error, which is what c10d expects from a Store.
class CoordinatorStore : public c10d::Store {
 public:
  // Shares `client`: a group given up while connecting keeps using the store on its own thread.
  // Every call names `scope`: its generation lets the coordinator end a dead generation's
  // waits at once.
  CoordinatorStore(std::shared_ptr<WorkerRpc> client, StoreScope scope,
                   std::chrono::milliseconds timeout);

  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override;
  std::vector<uint8_t> get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t value) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  int64_t getNumKeys() override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  std::shared_ptr<WorkerRpc> client_;
  const StoreScope scope_;
};

}  // namespace trainstep

#endif  // TRAINSTEP_WORKER_COLLECTIVE_COORDINATOR_STORE_H_
