// WorkerService over gRPC: each unary handler forwards to the Coordinator (rpc_table.h);
// Attach is a server stream. No policy here.
#ifndef TRAINSTEP_COORDINATOR_WORKER_SERVICE_H_
#define TRAINSTEP_COORDINATOR_WORKER_SERVICE_H_

#include "coordinator/coordinator.h"
#include "coordinator/grpc_adapters.h"
#include "coordinator/rpc_auth.h"
#include "trainstep/v1/worker_service.grpc.pb.h"

namespace trainstep {

class WorkerServiceImpl final : public v1::WorkerService::CallbackService {
 public:
  // `auth` (not owned) authorizes every call; null: everyone may call everything.
  explicit WorkerServiceImpl(Coordinator* coordinator, RpcAuthorizer* auth = nullptr)
      : c_(coordinator), auth_(auth) {}

  TRAINSTEP_WORKER_SERVICE_UNARY(TRAINSTEP_DECLARE_UNARY_HANDLER)
  grpc::ServerWriteReactor<v1::AttachEvent>* Attach(grpc::CallbackServerContext*,
                                                    const v1::AttachRequest* req) override;

 private:
  Coordinator* c_;
  RpcAuthorizer* auth_;
};

}  // namespace trainstep

#endif  // TRAINSTEP_COORDINATOR_WORKER_SERVICE_H_
