// JobService over gRPC: thin handlers over the Coordinator (rpc_table.h); WatchJob is a server
// stream that asks the coordinator for the next batch whenever the previous one was written.
#ifndef TRAINSTEP_COORDINATOR_JOB_SERVICE_H_
#define TRAINSTEP_COORDINATOR_JOB_SERVICE_H_

#include "coordinator/coordinator.h"
#include "coordinator/grpc_adapters.h"
#include "coordinator/rpc_auth.h"
#include "trainstep/v1/job_service.grpc.pb.h"

namespace trainstep {

class JobServiceImpl final : public v1::JobService::CallbackService {
 public:
  // `auth` (not owned) authorizes every call; null: everyone may call everything.
  explicit JobServiceImpl(Coordinator* coordinator, RpcAuthorizer* auth = nullptr)
      : c_(coordinator), auth_(auth) {}

  TRAINSTEP_JOB_SERVICE_UNARY(TRAINSTEP_DECLARE_UNARY_HANDLER)
  grpc::ServerWriteReactor<v1::WatchJobEvent>* WatchJob(grpc::CallbackServerContext*,
                                                        const v1::WatchJobRequest* req) override;

 private:
  Coordinator* c_;
  RpcAuthorizer* auth_;
};

}  // namespace trainstep

#endif  // TRAINSTEP_COORDINATOR_JOB_SERVICE_H_
