// CoordinatorServer: the gRPC server around a Coordinator (both services, health,
// reflection, keepalive policy) plus the driver thread that ticks it. main.cc and the
// loopback tests start it the same way. Secured (TLS credentials and an RpcAuthorizer), it
// serves nothing unauthenticated but health: reflection is left out, since it cannot be
// authorized. A second, plaintext port may serve grpc.health.v1 alone, for kubelet probes.
#ifndef TRAINSTEP_COORDINATOR_SERVER_H_
#define TRAINSTEP_COORDINATOR_SERVER_H_

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "coordinator/coordinator.h"
#include "coordinator/job_service.h"
#include "coordinator/rpc_auth.h"
#include "coordinator/worker_service.h"

namespace trainstep {

struct ServerOptions {
  std::string address;                                   // host:port; port 0 = a free one
  std::shared_ptr<grpc::ServerCredentials> credentials;  // null: plaintext
  RpcAuthorizer* auth = nullptr;                         // not owned; null: every call allowed
  std::string health_address;                            // "" = no health-only port
};

// The named health service that is NOT_SERVING while the coordinator holds its decisions (its
// journal cannot be written). The overall health ("") stays SERVING then: a restart would not
// help, and reads are still served.
inline constexpr char kDecisionsHealthService[] = "trainstep.decisions";

class CoordinatorServer {
 public:
  // Listens and starts ticking `coordinator` (not owned).
  static absl::StatusOr<std::unique_ptr<CoordinatorServer>> Start(Coordinator* coordinator,
                                                                  const ServerOptions& options);
  // Plaintext on `address`, no authorization (loopback tests).
  static absl::StatusOr<std::unique_ptr<CoordinatorServer>> Start(Coordinator* coordinator,
                                                                  const std::string& address);
  ~CoordinatorServer();

  int port() const { return port_; }
  int health_port() const { return health_port_; }  // 0 without a health-only port
  // Health NOT_SERVING (on both ports), waiting calls answered UNAVAILABLE, in-flight calls
  // get `grace`.
  void Shutdown(absl::Duration grace);

 private:
  CoordinatorServer(Coordinator* coordinator, RpcAuthorizer* auth);
  // kDecisionsHealthService's status, on both ports.
  void SetDeciding(bool deciding);

  Coordinator* coordinator_;
  WorkerServiceImpl worker_service_;
  JobServiceImpl job_service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  // The health-only port: gRPC's default health service, and UNIMPLEMENTED for the rest.
  grpc::CallbackGenericService unimplemented_;
  std::unique_ptr<grpc::Server> health_server_;
  int health_port_ = 0;
  absl::Notification stop_;
  std::thread driver_;
  bool shut_down_ = false;
};

}  // namespace trainstep

#endif  // TRAINSTEP_COORDINATOR_SERVER_H_
