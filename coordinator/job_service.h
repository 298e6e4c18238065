// JobService over gRPC: thin handlers over the Coordinator (rpc_table.h); WatchJob is a server
// stream that asks the coordinator for the next batch whenever the previous one was written.
#ifndef TRAINSTEP_COORDINATOR_JOB_SERVICE_H_
#define TRAINSTEP_COORDINATOR_JOB_SERVICE_H_

#include "coordinator/grpc_adapters.h"
#include "trainstep/v1/job_service.grpc.pb.h"

namespace trainstep {

class JobServiceImpl final : public v1::JobService::CallbackService, private ServiceWiring {
 public:
  using ServiceWiring::ServiceWiring;
  TRAINSTEP_JOB_SERVICE_UNARY(TRAINSTEP_DECLARE_UNARY_HANDLER)
  grpc::ServerWriteReactor<v1::WatchJobEvent>* WatchJob(grpc::CallbackServerContext*,
                                                        const v1::WatchJobRequest* req) override;
};

}  // namespace trainstep

#endif  // TRAINSTEP_COORDINATOR_JOB_SERVICE_H_
