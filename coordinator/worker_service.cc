#include "coordinator/worker_service.h"

#include "coordinator/grpc_adapters.h"

namespace trainstep {

// Handlers that never wait ignore the call handle; waiting ones pass it so an abandoned
// call stops being polled.
#define TRAINSTEP_FORWARD(Method, Req, Resp)                                                \
  grpc::ServerUnaryReactor* WorkerServiceImpl::Method(grpc::CallbackServerContext*,         \
                                                      const v1::Req* req, v1::Resp* resp) { \
    return ServeUnary(resp, [&](Done<v1::Resp> done, std::shared_ptr<CallHandle>) {         \
      c_->Method(*req, std::move(done));                                                    \
    });                                                                                     \
  }
#define TRAINSTEP_FORWARD_WAITING(Method, Req, Resp)                                        \
  grpc::ServerUnaryReactor* WorkerServiceImpl::Method(grpc::CallbackServerContext*,         \
                                                      const v1::Req* req, v1::Resp* resp) { \
    return ServeUnary(resp, [&](Done<v1::Resp> done, std::shared_ptr<CallHandle> handle) {  \
      c_->Method(*req, std::move(done), std::move(handle));                                 \
    });                                                                                     \
  }

TRAINSTEP_FORWARD(RegisterWorker, RegisterWorkerRequest, RegisterWorkerResponse)
TRAINSTEP_FORWARD(Heartbeat, HeartbeatRequest, HeartbeatResponse)
TRAINSTEP_FORWARD_WAITING(BeginWindow, BeginWindowRequest, BeginWindowResponse)
TRAINSTEP_FORWARD_WAITING(CompleteWindow, CompleteWindowRequest, CompleteWindowResponse)
TRAINSTEP_FORWARD(AckCheckpoint, AckCheckpointRequest, AckCheckpointResponse)
TRAINSTEP_FORWARD_WAITING(ReportEval, ReportEvalRequest, ReportEvalResponse)
TRAINSTEP_FORWARD(ReportFailure, ReportFailureRequest, ReportFailureResponse)
TRAINSTEP_FORWARD(StoreSet, StoreSetRequest, StoreSetResponse)
TRAINSTEP_FORWARD_WAITING(StoreGet, StoreGetRequest, StoreGetResponse)
TRAINSTEP_FORWARD(StoreAdd, StoreAddRequest, StoreAddResponse)
TRAINSTEP_FORWARD(StoreCompareSet, StoreCompareSetRequest, StoreCompareSetResponse)
TRAINSTEP_FORWARD(StoreCheck, StoreCheckRequest, StoreCheckResponse)
TRAINSTEP_FORWARD_WAITING(StoreWait, StoreWaitRequest, StoreWaitResponse)
TRAINSTEP_FORWARD(StoreDeleteKey, StoreDeleteKeyRequest, StoreDeleteKeyResponse)
TRAINSTEP_FORWARD(StoreNumKeys, StoreNumKeysRequest, StoreNumKeysResponse)

#undef TRAINSTEP_FORWARD
#undef TRAINSTEP_FORWARD_WAITING

}  // namespace trainstep
