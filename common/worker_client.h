// WorkerClient: the worker's side of WorkerService, shared by trainstep-worker and the
// simulated workers of the tests. Every call has a deadline. Reports are idempotent on
// (job, generation, window, rank), so UNAVAILABLE (coordinator restarting) and an expired
// barrier deadline are retried with backoff; ABORTED and the other codes are returned
// for the protocol to handle.
#ifndef TRAINSTEP_COMMON_WORKER_CLIENT_H_
#define TRAINSTEP_COMMON_WORKER_CLIENT_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "trainstep/v1/worker_service.grpc.pb.h"

namespace trainstep {

// The largest message the coordinator receives: gRPC's default, set explicitly on its server
// so that clients can check a request against it before sending it.
inline constexpr int kMaxMessageBytes = 4 * 1024 * 1024;

// A channel with the project's conventions: keepalive 30 s / 10 s, transparent retries of
// UNAVAILABLE (5 attempts, exponential backoff), default 4 MiB messages.
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address);

struct WorkerClientOptions {
  absl::Duration rpc_timeout = absl::Seconds(10);    // unary calls that never wait
  absl::Duration barrier_poll = absl::Seconds(30);   // one barrier call's deadline; then re-sent
  absl::Duration give_up_after = absl::Minutes(30);  // a barrier or store wait never answered
  absl::Duration max_backoff = absl::Seconds(2);
  // RegisterWorker keeps trying an unreachable (or silent, or garbled) coordinator this long;
  // zero = forever. Each failed attempt is passed to on_connect_retry (may be empty).
  absl::Duration connect_timeout = absl::Minutes(2);
  std::function<void(const absl::Status&)> on_connect_retry;
  // Asked between retries of a barrier; returning false stops waiting (e.g. the job ended).
  std::function<bool()> keep_waiting;
};

class WorkerClient {
 public:
  WorkerClient(std::shared_ptr<grpc::Channel> channel, WorkerClientOptions options = {});

  // Retries UNAVAILABLE / DEADLINE_EXCEEDED for up to options.connect_timeout, then fails with
  // DEADLINE_EXCEEDED naming the wait and the last error.
  absl::StatusOr<v1::RegisterWorkerResponse> RegisterWorker(const v1::RegisterWorkerRequest& req);
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& req);
  absl::StatusOr<v1::BeginWindowResponse> BeginWindow(const v1::BeginWindowRequest& req);
  absl::StatusOr<v1::CompleteWindowResponse> CompleteWindow(const v1::CompleteWindowRequest& req);
  absl::StatusOr<v1::ReportEvalResponse> ReportEval(const v1::ReportEvalRequest& req);
  absl::Status AckCheckpoint(const v1::AckCheckpointRequest& req);
  absl::Status ReportFailure(const v1::ReportFailureRequest& req);

  absl::Status StoreSet(const std::string& job_id, const std::string& key,
                        const std::string& value);
  // Waits up to `timeout` for the key.
  absl::StatusOr<std::string> StoreGet(const std::string& job_id, const std::string& key,
                                       absl::Duration timeout);
  absl::StatusOr<int64_t> StoreAdd(const std::string& job_id, const std::string& key,
                                   int64_t delta);
  absl::StatusOr<std::string> StoreCompareSet(const std::string& job_id, const std::string& key,
                                              const std::string& expected,
                                              const std::string& desired);
  absl::StatusOr<bool> StoreCheck(const std::string& job_id, const std::vector<std::string>& keys);
  absl::Status StoreWait(const std::string& job_id, const std::vector<std::string>& keys,
                         absl::Duration timeout);
  absl::StatusOr<bool> StoreDeleteKey(const std::string& job_id, const std::string& key);
  absl::StatusOr<int64_t> StoreNumKeys(const std::string& job_id);

 private:
  // One unary call with a deadline of `timeout`.
  template <typename Req, typename Resp, typename Method>
  absl::StatusOr<Resp> Call(Method method, const Req& req, absl::Duration timeout);
  // A waiting call: re-sent while it expires or the coordinator is unavailable.
  template <typename Req, typename Resp, typename Method>
  absl::StatusOr<Resp> CallWaiting(Method method, const Req& req, absl::Duration total);

  std::unique_ptr<v1::WorkerService::Stub> stub_;
  WorkerClientOptions options_;
};

}  // namespace trainstep

#endif  // TRAINSTEP_COMMON_WORKER_CLIENT_H_
