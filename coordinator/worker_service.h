// WorkerService over gRPC: each handler forwards to the Coordinator. No policy here.
#ifndef TRAINSTEP_COORDINATOR_WORKER_SERVICE_H_
#define TRAINSTEP_COORDINATOR_WORKER_SERVICE_H_

#include "coordinator/coordinator.h"
#include "coordinator/rpc_auth.h"
#include "trainstep/v1/worker_service.grpc.pb.h"

namespace trainstep {

class WorkerServiceImpl final : public v1::WorkerService::CallbackService {
 public:
  // `auth` (not owned) authorizes every call; null: everyone may call everything.
  explicit WorkerServiceImpl(Coordinator* coordinator, RpcAuthorizer* auth = nullptr)
      : c_(coordinator), auth_(auth) {}

  grpc::ServerUnaryReactor* RegisterWorker(grpc::CallbackServerContext*,
                                           const v1::RegisterWorkerRequest* req,
                                           v1::RegisterWorkerResponse* resp) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext*, const v1::HeartbeatRequest* req,
                                      v1::HeartbeatResponse* resp) override;
  grpc::ServerUnaryReactor* BeginWindow(grpc::CallbackServerContext*,
                                        const v1::BeginWindowRequest* req,
                                        v1::BeginWindowResponse* resp) override;
  grpc::ServerUnaryReactor* CompleteWindow(grpc::CallbackServerContext*,
                                           const v1::CompleteWindowRequest* req,
                                           v1::CompleteWindowResponse* resp) override;
  grpc::ServerUnaryReactor* AckCheckpoint(grpc::CallbackServerContext*,
                                          const v1::AckCheckpointRequest* req,
                                          v1::AckCheckpointResponse* resp) override;
  grpc::ServerUnaryReactor* ReportEval(grpc::CallbackServerContext*,
                                       const v1::ReportEvalRequest* req,
                                       v1::ReportEvalResponse* resp) override;
  grpc::ServerUnaryReactor* ReportFailure(grpc::CallbackServerContext*,
                                          const v1::ReportFailureRequest* req,
                                          v1::ReportFailureResponse* resp) override;
  grpc::ServerWriteReactor<v1::AttachEvent>* Attach(grpc::CallbackServerContext*,
                                                    const v1::AttachRequest* req) override;
  grpc::ServerUnaryReactor* StoreSet(grpc::CallbackServerContext*, const v1::StoreSetRequest* req,
                                     v1::StoreSetResponse* resp) override;
  grpc::ServerUnaryReactor* StoreGet(grpc::CallbackServerContext*, const v1::StoreGetRequest* req,
                                     v1::StoreGetResponse* resp) override;
  grpc::ServerUnaryReactor* StoreAdd(grpc::CallbackServerContext*, const v1::StoreAddRequest* req,
                                     v1::StoreAddResponse* resp) override;
  grpc::ServerUnaryReactor* StoreCompareSet(grpc::CallbackServerContext*,
                                            const v1::StoreCompareSetRequest* req,
                                            v1::StoreCompareSetResponse* resp) override;
  grpc::ServerUnaryReactor* StoreCheck(grpc::CallbackServerContext*,
                                       const v1::StoreCheckRequest* req,
                                       v1::StoreCheckResponse* resp) override;
  grpc::ServerUnaryReactor* StoreWait(grpc::CallbackServerContext*, const v1::StoreWaitRequest* req,
                                      v1::StoreWaitResponse* resp) override;
  grpc::ServerUnaryReactor* StoreDeleteKey(grpc::CallbackServerContext*,
                                           const v1::StoreDeleteKeyRequest* req,
                                           v1::StoreDeleteKeyResponse* resp) override;
  grpc::ServerUnaryReactor* StoreNumKeys(grpc::CallbackServerContext*,
                                         const v1::StoreNumKeysRequest* req,
                                         v1::StoreNumKeysResponse* resp) override;

 private:
  Coordinator* c_;
  RpcAuthorizer* auth_;
};

}  // namespace trainstep

#endif  // TRAINSTEP_COORDINATOR_WORKER_SERVICE_H_
