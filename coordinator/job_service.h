// JobService over gRPC: thin handlers over the Coordinator; WatchJob is a server stream
// that asks the coordinator for the next batch whenever the previous one was written.
#ifndef TRAINSTEP_COORDINATOR_JOB_SERVICE_H_
#define TRAINSTEP_COORDINATOR_JOB_SERVICE_H_

#include "coordinator/coordinator.h"
#include "coordinator/rpc_auth.h"
#include "trainstep/v1/job_service.grpc.pb.h"

namespace trainstep {

class JobServiceImpl final : public v1::JobService::CallbackService {
 public:
  // `auth` (not owned) authorizes every call; null: everyone may call everything.
  explicit JobServiceImpl(Coordinator* coordinator, RpcAuthorizer* auth = nullptr)
      : c_(coordinator), auth_(auth) {}

  grpc::ServerUnaryReactor* SubmitJob(grpc::CallbackServerContext*, const v1::SubmitJobRequest* req,
                                      v1::Job* resp) override;
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext*, const v1::GetJobRequest* req,
                                   v1::Job* resp) override;
  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext*, const v1::ListJobsRequest* req,
                                     v1::ListJobsResponse* resp) override;
  grpc::ServerWriteReactor<v1::WatchJobEvent>* WatchJob(grpc::CallbackServerContext*,
                                                        const v1::WatchJobRequest* req) override;
  grpc::ServerUnaryReactor* CancelJob(grpc::CallbackServerContext*, const v1::CancelJobRequest* req,
                                      v1::Job* resp) override;
  grpc::ServerUnaryReactor* ListUpdates(grpc::CallbackServerContext*,
                                        const v1::ListUpdatesRequest* req,
                                        v1::ListUpdatesResponse* resp) override;
  grpc::ServerUnaryReactor* ListWorkers(grpc::CallbackServerContext*,
                                        const v1::ListWorkersRequest* req,
                                        v1::ListWorkersResponse* resp) override;

 private:
  Coordinator* c_;
  RpcAuthorizer* auth_;
};

}  // namespace trainstep

#endif  // TRAINSTEP_COORDINATOR_JOB_SERVICE_H_
