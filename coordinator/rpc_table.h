// The coordinator's RPC surface, one line a method. A unary line X(Method, Request, Response,
// Access) generates the Coordinator's method (answered by its Answer<Method>, under the lock),
// the gRPC handler that forwards to it, and the method's access in the authorization table.
// Adding a unary RPC: the proto, the Answer<Method> body, and one line here.
//
// The two streams (WatchJob, Attach) keep their reactors written by hand (job_service.cc,
// worker_service.cc); only their access is listed here.
#ifndef TRAINSTEP_COORDINATOR_RPC_TABLE_H_
#define TRAINSTEP_COORDINATOR_RPC_TABLE_H_

namespace trainstep {

// What a method needs (the table's last column): the authorizer grants it by role, and while
// the journal cannot be written the coordinator answers only kView methods (they change
// nothing).
enum class Access { kView, kSubmit, kCancel, kWorker };

}  // namespace trainstep

// JobService (job_calls.cc).
#define TRAINSTEP_JOB_SERVICE_UNARY(X)                           \
  X(SubmitJob, SubmitJobRequest, Job, kSubmit)                   \
  X(GetJob, GetJobRequest, Job, kView)                           \
  X(ListJobs, ListJobsRequest, ListJobsResponse, kView)          \
  X(CancelJob, CancelJobRequest, Job, kCancel)                   \
  X(ListUpdates, ListUpdatesRequest, ListUpdatesResponse, kView) \
  X(ListWorkers, ListWorkersRequest, ListWorkersResponse, kView)

// WorkerService: membership, the window barriers, checkpoints and evaluation
// (worker_calls.cc), then the rendezvous store (store/store_calls.cc).
#define TRAINSTEP_WORKER_SERVICE_UNARY(X)                                      \
  X(RegisterWorker, RegisterWorkerRequest, RegisterWorkerResponse, kWorker)    \
  X(Heartbeat, HeartbeatRequest, HeartbeatResponse, kWorker)                   \
  X(BeginWindow, BeginWindowRequest, BeginWindowResponse, kWorker)             \
  X(CompleteWindow, CompleteWindowRequest, CompleteWindowResponse, kWorker)    \
  X(AckCheckpoint, AckCheckpointRequest, AckCheckpointResponse, kWorker)       \
  X(ReportEval, ReportEvalRequest, ReportEvalResponse, kWorker)                \
  X(ReportFailure, ReportFailureRequest, ReportFailureResponse, kWorker)       \
  X(StoreSet, StoreSetRequest, StoreSetResponse, kWorker)                      \
  X(StoreGet, StoreGetRequest, StoreGetResponse, kWorker)                      \
  X(StoreAdd, StoreAddRequest, StoreAddResponse, kWorker)                      \
  X(StoreCompareSet, StoreCompareSetRequest, StoreCompareSetResponse, kWorker) \
  X(StoreCheck, StoreCheckRequest, StoreCheckResponse, kWorker)                \
  X(StoreWait, StoreWaitRequest, StoreWaitResponse, kWorker)                   \
  X(StoreDeleteKey, StoreDeleteKeyRequest, StoreDeleteKeyResponse, kWorker)    \
  X(StoreNumKeys, StoreNumKeysRequest, StoreNumKeysResponse, kWorker)

// Server streams: X(Method, Access).
#define TRAINSTEP_STREAMS(X) \
  X(WatchJob, kView)         \
  X(Attach, kWorker)

#endif  // TRAINSTEP_COORDINATOR_RPC_TABLE_H_
