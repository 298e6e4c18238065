// The worker's gRPC health service (--health-listen), for a Kubernetes liveness probe:
// SERVING while its compute thread makes progress, NOT_SERVING once it stays in a step of its
// own work past the coordinator's hang deadline (ComputePhase::Stuck), so that a hung process
// is restarted. The coordinator fences such a rank on its own; this ends the process, which
// may never wake up. Only the health service listens there.
#ifndef TRAINSTEP_WORKER_LINK_HEALTH_SERVICE_H_
#define TRAINSTEP_WORKER_LINK_HEALTH_SERVICE_H_

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "worker/link/compute_phase.h"

namespace trainstep {

class WorkerHealth {
 public:
  // Listens on `address` (host:port; port 0 picks a free one) and looks at `phase` (not owned)
  // every `every`. UNAVAILABLE naming the address if it cannot listen.
  static absl::StatusOr<std::unique_ptr<WorkerHealth>> Start(
      const std::string& address, const ComputePhase* phase,
      absl::Duration every = absl::Milliseconds(250));
  ~WorkerHealth();

  int port() const { return port_; }

 private:
  WorkerHealth() = default;

  grpc::CallbackGenericService unimplemented_;  // every other method: UNIMPLEMENTED
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  absl::Notification stop_;
  std::thread watch_;
};

}  // namespace trainstep

#endif  // TRAINSTEP_WORKER_LINK_HEALTH_SERVICE_H_
