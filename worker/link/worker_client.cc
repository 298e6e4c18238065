#include "worker/link/worker_client.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"

namespace trainstep {
namespace {

// A failure worth re-sending the call for: the coordinator restarting or unreachable, an
// attempt's deadline, or the server dropping the call as it shut down (the calls retried here
// are never cancelled by this client; only Attach is, and it is not retried here).
bool IsTransient(absl::StatusCode code) {
  return code == absl::StatusCode::kUnavailable || code == absl::StatusCode::kDeadlineExceeded ||
         code == absl::StatusCode::kCancelled;
}

std::chrono::system_clock::time_point DeadlineAfter(absl::Duration d) {
  return std::chrono::system_clock::now() + std::chrono::microseconds(absl::ToInt64Microseconds(d));
}

}  // namespace

WorkerClient::WorkerClient(std::shared_ptr<grpc::Channel> channel, WorkerClientOptions options)
    : stub_(v1::WorkerService::NewStub(std::move(channel))), options_(std::move(options)) {}

template <typename Req, typename Resp, typename Method>
absl::StatusOr<Resp> WorkerClient::Call(Method method, const Req& req, absl::Duration timeout) {
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineAfter(timeout));
  Resp resp;
  grpc::Status status = (stub_.get()->*method)(&ctx, req, &resp);
  if (!status.ok()) return FromGrpcStatus(status);
  return resp;
}

template <typename Req, typename Resp, typename Method>
absl::StatusOr<Resp> WorkerClient::CallWaiting(Method method, const Req& req,
                                               absl::Duration total) {
  const absl::Time give_up = absl::Now() + total;
  absl::Duration backoff = absl::Milliseconds(50);
  while (true) {
    const absl::Duration left = give_up - absl::Now();
    absl::StatusOr<Resp> r = Call<Req, Resp>(method, req, std::min(options_.barrier_poll, left));
    if (r.ok()) return r;
    const absl::StatusCode code = r.status().code();
    // Reports are idempotent: re-sending after a lost answer or a restart is safe.
    if (!IsTransient(code)) return r;
    if (absl::Now() >= give_up) {
      return absl::DeadlineExceededError(absl::StrCat("no answer from the coordinator within ",
                                                      absl::FormatDuration(total), ": ",
                                                      r.status().message()));
    }
    if (options_.keep_waiting && !options_.keep_waiting()) return r;
    if (code != absl::StatusCode::kDeadlineExceeded) {
      std::this_thread::sleep_for(std::chrono::microseconds(absl::ToInt64Microseconds(backoff)));
      backoff = std::min(backoff * 2, options_.max_backoff);
    }
  }
}

absl::StatusOr<v1::RegisterWorkerResponse> WorkerClient::RegisterWorker(
    const v1::RegisterWorkerRequest& req) {
  const bool forever = options_.connect_timeout <= absl::ZeroDuration();
  const absl::Time give_up = absl::Now() + options_.connect_timeout;
  absl::Duration backoff = absl::Milliseconds(100);
  while (true) {
    const absl::Duration attempt =
        forever ? options_.rpc_timeout
                : std::max(absl::Milliseconds(100),
                           std::min(options_.rpc_timeout, give_up - absl::Now()));
    // Idempotent on the request id: a retry after a lost answer returns the same worker.
    absl::StatusOr<v1::RegisterWorkerResponse> r =
        Call<v1::RegisterWorkerRequest, v1::RegisterWorkerResponse>(
            &v1::WorkerService::Stub::RegisterWorker, req, attempt);
    if (r.ok()) return r;
    const absl::StatusCode code = r.status().code();
    if (!IsTransient(code)) return r;
    if (options_.on_connect_retry) options_.on_connect_retry(r.status());
    if (!forever && absl::Now() >= give_up) {
      return absl::DeadlineExceededError(absl::StrCat(
          "no answer from the coordinator within ", absl::FormatDuration(options_.connect_timeout),
          " (--connect-timeout); last error: ", absl::StatusCodeToString(code), ": ",
          r.status().message()));
    }
    const absl::Duration nap = forever ? backoff : std::min(backoff, give_up - absl::Now());
    if (nap > absl::ZeroDuration()) {
      std::this_thread::sleep_for(std::chrono::microseconds(absl::ToInt64Microseconds(nap)));
    }
    backoff = std::min(backoff * 2, options_.max_backoff);
  }
}

absl::StatusOr<v1::HeartbeatResponse> WorkerClient::Heartbeat(const v1::HeartbeatRequest& req) {
  return Call<v1::HeartbeatRequest, v1::HeartbeatResponse>(&v1::WorkerService::Stub::Heartbeat, req,
                                                           options_.rpc_timeout);
}

void CallCanceller::Cancel() {
  absl::MutexLock lock(&mu_);
  cancelled_ = true;
  if (cancel_) cancel_();
}

bool CallCanceller::Enter(std::function<void()> cancel) {
  absl::MutexLock lock(&mu_);
  if (cancelled_) return false;
  cancel_ = std::move(cancel);
  return true;
}

void CallCanceller::Leave() {
  absl::MutexLock lock(&mu_);
  cancel_ = nullptr;
}

absl::Status WorkerClient::Attach(const v1::AttachRequest& req,
                                  const std::function<void(const v1::HeartbeatResponse&)>& on_place,
                                  CallCanceller* canceller) {
  grpc::ClientContext ctx;  // no deadline: open for the process's life (keepalive pings)
  if (!canceller->Enter([&ctx] { ctx.TryCancel(); })) {
    return absl::CancelledError("the worker is stopping");
  }
  std::unique_ptr<grpc::ClientReader<v1::AttachEvent>> reader = stub_->Attach(&ctx, req);
  v1::AttachEvent event;
  while (reader->Read(&event)) on_place(event.place());
  const grpc::Status status = reader->Finish();
  canceller->Leave();
  return FromGrpcStatus(status);
}

absl::StatusOr<v1::BeginWindowResponse> WorkerClient::BeginWindow(
    const v1::BeginWindowRequest& req) {
  return CallWaiting<v1::BeginWindowRequest, v1::BeginWindowResponse>(
      &v1::WorkerService::Stub::BeginWindow, req, options_.give_up_after);
}

absl::StatusOr<v1::CompleteWindowResponse> WorkerClient::CompleteWindow(
    const v1::CompleteWindowRequest& req) {
  return CallWaiting<v1::CompleteWindowRequest, v1::CompleteWindowResponse>(
      &v1::WorkerService::Stub::CompleteWindow, req, options_.give_up_after);
}

absl::StatusOr<v1::ReportEvalResponse> WorkerClient::ReportEval(const v1::ReportEvalRequest& req) {
  return CallWaiting<v1::ReportEvalRequest, v1::ReportEvalResponse>(
      &v1::WorkerService::Stub::ReportEval, req, options_.give_up_after);
}

absl::Status WorkerClient::AckCheckpoint(const v1::AckCheckpointRequest& req) {
  return CallWaiting<v1::AckCheckpointRequest, v1::AckCheckpointResponse>(
             &v1::WorkerService::Stub::AckCheckpoint, req, options_.rpc_timeout * 6)
      .status();
}

absl::Status WorkerClient::ReportFailure(const v1::ReportFailureRequest& req) {
  return Call<v1::ReportFailureRequest, v1::ReportFailureResponse>(
             &v1::WorkerService::Stub::ReportFailure, req, options_.rpc_timeout)
      .status();
}

absl::Status WorkerClient::StoreSet(const StoreScope& scope, const std::string& key,
                                    const std::string& value) {
  v1::StoreSetRequest req;
  req.set_job_id(scope.job_id);
  req.set_generation(scope.generation);
  req.set_key(key);
  req.set_value(value);
  return CallWaiting<v1::StoreSetRequest, v1::StoreSetResponse>(&v1::WorkerService::Stub::StoreSet,
                                                                req, options_.rpc_timeout * 6)
      .status();
}

absl::StatusOr<std::string> WorkerClient::StoreGet(const StoreScope& scope, const std::string& key,
                                                   absl::Duration timeout) {
  v1::StoreGetRequest req;
  req.set_job_id(scope.job_id);
  req.set_generation(scope.generation);
  req.set_key(key);
  absl::StatusOr<v1::StoreGetResponse> r = CallWaiting<v1::StoreGetRequest, v1::StoreGetResponse>(
      &v1::WorkerService::Stub::StoreGet, req, timeout);
  if (!r.ok()) return r.status();
  return r->value();
}

absl::StatusOr<int64_t> WorkerClient::StoreAdd(const StoreScope& scope, const std::string& key,
                                               int64_t delta) {
  v1::StoreAddRequest req;
  req.set_job_id(scope.job_id);
  req.set_generation(scope.generation);
  req.set_key(key);
  req.set_delta(delta);
  // Not idempotent: one attempt (transparent retries only happen when nothing was sent).
  absl::StatusOr<v1::StoreAddResponse> r = Call<v1::StoreAddRequest, v1::StoreAddResponse>(
      &v1::WorkerService::Stub::StoreAdd, req, options_.rpc_timeout);
  if (!r.ok()) return r.status();
  return r->value();
}

absl::StatusOr<std::string> WorkerClient::StoreCompareSet(const StoreScope& scope,
                                                          const std::string& key,
                                                          const std::string& expected,
                                                          const std::string& desired) {
  v1::StoreCompareSetRequest req;
  req.set_job_id(scope.job_id);
  req.set_generation(scope.generation);
  req.set_key(key);
  req.set_expected(expected);
  req.set_desired(desired);
  absl::StatusOr<v1::StoreCompareSetResponse> r =
      Call<v1::StoreCompareSetRequest, v1::StoreCompareSetResponse>(
          &v1::WorkerService::Stub::StoreCompareSet, req, options_.rpc_timeout);
  if (!r.ok()) return r.status();
  return r->value();
}

absl::StatusOr<bool> WorkerClient::StoreCheck(const StoreScope& scope,
                                              const std::vector<std::string>& keys) {
  v1::StoreCheckRequest req;
  req.set_job_id(scope.job_id);
  req.set_generation(scope.generation);
  for (const std::string& k : keys) req.add_keys(k);
  absl::StatusOr<v1::StoreCheckResponse> r = Call<v1::StoreCheckRequest, v1::StoreCheckResponse>(
      &v1::WorkerService::Stub::StoreCheck, req, options_.rpc_timeout);
  if (!r.ok()) return r.status();
  return r->all_present();
}

absl::Status WorkerClient::StoreWait(const StoreScope& scope, const std::vector<std::string>& keys,
                                     absl::Duration timeout) {
  v1::StoreWaitRequest req;
  req.set_job_id(scope.job_id);
  req.set_generation(scope.generation);
  for (const std::string& k : keys) req.add_keys(k);
  return CallWaiting<v1::StoreWaitRequest, v1::StoreWaitResponse>(
             &v1::WorkerService::Stub::StoreWait, req, timeout)
      .status();
}

absl::StatusOr<bool> WorkerClient::StoreDeleteKey(const StoreScope& scope, const std::string& key) {
  v1::StoreDeleteKeyRequest req;
  req.set_job_id(scope.job_id);
  req.set_generation(scope.generation);
  req.set_key(key);
  absl::StatusOr<v1::StoreDeleteKeyResponse> r =
      Call<v1::StoreDeleteKeyRequest, v1::StoreDeleteKeyResponse>(
          &v1::WorkerService::Stub::StoreDeleteKey, req, options_.rpc_timeout);
  if (!r.ok()) return r.status();
  return r->deleted();
}

absl::StatusOr<int64_t> WorkerClient::StoreNumKeys(const StoreScope& scope) {
  v1::StoreNumKeysRequest req;
  req.set_job_id(scope.job_id);
  req.set_generation(scope.generation);
  absl::StatusOr<v1::StoreNumKeysResponse> r =
      Call<v1::StoreNumKeysRequest, v1::StoreNumKeysResponse>(
          &v1::WorkerService::Stub::StoreNumKeys, req, options_.rpc_timeout);
  if (!r.ok()) return r.status();
  return r->num_keys();
}

}  // namespace trainstep
