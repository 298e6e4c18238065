// WorkerService over gRPC: each unary handler forwards to the Coordinator (rpc_table.h);
// Attach is a server stream. No policy here.
#ifndef TRAINSTEP_COORDINATOR_WORKER_SERVICE_H_
#define TRAINSTEP_COORDINATOR_WORKER_SERVICE_H_

#include "coordinator/grpc_adapters.h"
#include "trainstep/v1/worker_service.grpc.pb.h"

namespace trainstep {

class WorkerServiceImpl final : public v1::WorkerService::CallbackService, private ServiceWiring {
 public:
  using ServiceWiring::ServiceWiring;
  TRAINSTEP_WORKER_SERVICE_UNARY(TRAINSTEP_DECLARE_UNARY_HANDLER)
  grpc::ServerWriteReactor<v1::AttachEvent>* Attach(grpc::CallbackServerContext*,
                                                    const v1::AttachRequest* req) override;
};

}  // namespace trainstep

#endif  // TRAINSTEP_COORDINATOR_WORKER_SERVICE_H_
