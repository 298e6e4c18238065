// WorkerClient: the worker's side of WorkerService, shared by trainstep-worker and the
// simulated workers of the tests. Every call has a deadline. Reports are idempotent on
// (job, generation, window, rank), so UNAVAILABLE (coordinator restarting) and an expired
// barrier deadline are retried with backoff; ABORTED and the other codes are returned
// for the protocol to handle.
#ifndef TRAINSTEP_WORKER_LINK_WORKER_CLIENT_H_
#define TRAINSTEP_WORKER_LINK_WORKER_CLIENT_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/channel.h"
#include "common/tls.h"
#include "trainstep/v1/worker_service.grpc.pb.h"

namespace trainstep {

struct WorkerClientOptions {
  absl::Duration rpc_timeout = absl::Seconds(10);    // unary calls that never wait
  absl::Duration barrier_poll = absl::Seconds(30);   // one barrier call's deadline; then re-sent
  absl::Duration give_up_after = absl::Minutes(30);  // a barrier or store wait never answered
  // Between retries of a waiting call; short, so that a restarted coordinator is asked again
  // within a fraction of a second of listening.
  absl::Duration max_backoff = absl::Milliseconds(250);
  // RegisterWorker keeps trying an unreachable (or silent, or garbled) coordinator this long;
  // zero = forever. Each failed attempt is passed to on_connect_retry (may be empty).
  absl::Duration connect_timeout = absl::Minutes(2);
  std::function<void(const absl::Status&)> on_connect_retry;
  // Asked between retries of a barrier; returning false stops waiting (e.g. the job ended).
  std::function<bool()> keep_waiting;
};

// Ends a long call that another thread is running (thread-safe). Once cancelled, it also
// ends every later call at once.
class CallCanceller {
 public:
  void Cancel();
  // For the client running the call: `cancel` ends it from another thread. False when
  // already cancelled: do not start.
  bool Enter(std::function<void()> cancel);
  void Leave();

 private:
  mutable absl::Mutex mu_;
  std::function<void()> cancel_ ABSL_GUARDED_BY(mu_);
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

// The calls that make up a worker's membership, apart from its training: what the worker's
// control flow (worker/link/coordinator_link.h) needs, so its tests can answer without a server.
class WorkerControlClient {
 public:
  virtual ~WorkerControlClient() = default;
  virtual absl::StatusOr<v1::RegisterWorkerResponse> RegisterWorker(
      const v1::RegisterWorkerRequest& req) = 0;
  virtual absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& req) = 0;
  virtual absl::Status ReportFailure(const v1::ReportFailureRequest& req) = 0;
  // Holds the Attach stream open until it ends (returns how) or `canceller` ends it; every
  // place the coordinator pushes goes to `on_place`. UNIMPLEMENTED: this coordinator has no
  // Attach (leases alone then tell it that a worker is gone).
  virtual absl::Status Attach(const v1::AttachRequest& req,
                              const std::function<void(const v1::HeartbeatResponse&)>& on_place,
                              CallCanceller* canceller) {
    return absl::UnimplementedError("Attach");
  }
};

// Where a rendezvous store call belongs: the job, and the generation whose rendezvous it runs
// (Assignment.generation; 0 outside any).
struct StoreScope {
  std::string job_id;
  int64_t generation = 0;
};

// Every call a worker makes: the membership calls, the window barriers, checkpoints,
// evaluation and the rendezvous store. WorkerClient is the gRPC one; the Worker's unit tests
// answer with a fake coordinator in the same process.
class WorkerRpc : public WorkerControlClient {
 public:
  virtual absl::StatusOr<v1::BeginWindowResponse> BeginWindow(
      const v1::BeginWindowRequest& req) = 0;
  virtual absl::StatusOr<v1::CompleteWindowResponse> CompleteWindow(
      const v1::CompleteWindowRequest& req) = 0;
  virtual absl::StatusOr<v1::ReportEvalResponse> ReportEval(const v1::ReportEvalRequest& req) = 0;
  virtual absl::Status AckCheckpoint(const v1::AckCheckpointRequest& req) = 0;

  virtual absl::Status StoreSet(const StoreScope& scope, const std::string& key,
                                const std::string& value) = 0;
  // Waits up to `timeout` for the key.
  virtual absl::StatusOr<std::string> StoreGet(const StoreScope& scope, const std::string& key,
                                               absl::Duration timeout) = 0;
  virtual absl::StatusOr<int64_t> StoreAdd(const StoreScope& scope, const std::string& key,
                                           int64_t delta) = 0;
  virtual absl::StatusOr<std::string> StoreCompareSet(const StoreScope& scope,
                                                      const std::string& key,
                                                      const std::string& expected,
                                                      const std::string& desired) = 0;
  virtual absl::StatusOr<bool> StoreCheck(const StoreScope& scope,
                                          const std::vector<std::string>& keys) = 0;
  virtual absl::Status StoreWait(const StoreScope& scope, const std::vector<std::string>& keys,
                                 absl::Duration timeout) = 0;
  virtual absl::StatusOr<bool> StoreDeleteKey(const StoreScope& scope, const std::string& key) = 0;
  virtual absl::StatusOr<int64_t> StoreNumKeys(const StoreScope& scope) = 0;
};

class WorkerClient : public WorkerRpc {
 public:
  WorkerClient(std::shared_ptr<grpc::Channel> channel, WorkerClientOptions options = {});

  // Retries UNAVAILABLE / DEADLINE_EXCEEDED for up to options.connect_timeout, then fails with
  // DEADLINE_EXCEEDED naming the wait and the last error.
  absl::StatusOr<v1::RegisterWorkerResponse> RegisterWorker(
      const v1::RegisterWorkerRequest& req) override;
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& req) override;
  absl::StatusOr<v1::BeginWindowResponse> BeginWindow(const v1::BeginWindowRequest& req) override;
  absl::StatusOr<v1::CompleteWindowResponse> CompleteWindow(
      const v1::CompleteWindowRequest& req) override;
  absl::StatusOr<v1::ReportEvalResponse> ReportEval(const v1::ReportEvalRequest& req) override;
  absl::Status AckCheckpoint(const v1::AckCheckpointRequest& req) override;
  absl::Status ReportFailure(const v1::ReportFailureRequest& req) override;
  absl::Status Attach(const v1::AttachRequest& req,
                      const std::function<void(const v1::HeartbeatResponse&)>& on_place,
                      CallCanceller* canceller) override;

  absl::Status StoreSet(const StoreScope& scope, const std::string& key,
                        const std::string& value) override;
  absl::StatusOr<std::string> StoreGet(const StoreScope& scope, const std::string& key,
                                       absl::Duration timeout) override;
  absl::StatusOr<int64_t> StoreAdd(const StoreScope& scope, const std::string& key,
                                   int64_t delta) override;
  absl::StatusOr<std::string> StoreCompareSet(const StoreScope& scope, const std::string& key,
                                              const std::string& expected,
                                              const std::string& desired) override;
  absl::StatusOr<bool> StoreCheck(const StoreScope& scope,
                                  const std::vector<std::string>& keys) override;
  absl::Status StoreWait(const StoreScope& scope, const std::vector<std::string>& keys,
                         absl::Duration timeout) override;
  absl::StatusOr<bool> StoreDeleteKey(const StoreScope& scope, const std::string& key) override;
  absl::StatusOr<int64_t> StoreNumKeys(const StoreScope& scope) override;

 private:
  // One unary call with a deadline of `timeout`.
  template <typename Req, typename Resp, typename Method>
  absl::StatusOr<Resp> Call(Method method, const Req& req, absl::Duration timeout);
  // A waiting call: re-sent while it expires or the coordinator is unavailable, for up to
  // `total`.
  template <typename Req, typename Resp, typename Method>
  absl::StatusOr<Resp> CallWaiting(Method method, const Req& req, absl::Duration total);

  std::unique_ptr<v1::WorkerService::Stub> stub_;
  WorkerClientOptions options_;
};

}  // namespace trainstep

#endif  // TRAINSTEP_WORKER_LINK_WORKER_CLIENT_H_
