// CoordinatorServer: the gRPC server around a Coordinator (both services, health,
// reflection, keepalive policy) plus the driver thread that ticks it. main.cc and the
// loopback tests start it the same way.
#ifndef TRAINSTEP_COORDINATOR_SERVER_H_
#define TRAINSTEP_COORDINATOR_SERVER_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "coordinator/coordinator.h"
#include "coordinator/job_service.h"
#include "coordinator/worker_service.h"

namespace trainstep {

class CoordinatorServer {
 public:
  // Listens on `address` (port 0 = a free one) and starts ticking `coordinator` (not owned).
  static absl::StatusOr<std::unique_ptr<CoordinatorServer>> Start(Coordinator* coordinator,
                                                                  const std::string& address);
  ~CoordinatorServer();

  int port() const { return port_; }
  // Health NOT_SERVING, waiting calls answered UNAVAILABLE, in-flight calls get `grace`.
  void Shutdown(absl::Duration grace);

 private:
  explicit CoordinatorServer(Coordinator* coordinator);

  Coordinator* coordinator_;
  WorkerServiceImpl worker_service_;
  JobServiceImpl job_service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  absl::Notification stop_;
  std::thread driver_;
  bool shut_down_ = false;
};

}  // namespace trainstep

#endif  // TRAINSTEP_COORDINATOR_SERVER_H_
