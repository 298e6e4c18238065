#include "coordinator/job_service.h"

#include <deque>
#include <memory>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/record_position.h"

namespace trainstep {
namespace {

// Exact resumption (`after`) and the older window-id filter do not combine.
absl::Status CheckWatchRequest(const v1::WatchJobRequest& req) {
  if (req.has_after() && req.from_window_id() != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "WatchJobRequest sets both after (generation ", req.after().generation(), ", window ",
        req.after().window_id(), ") and from_window_id (", req.from_window_id(), "); set one"));
  }
  return absl::OkStatus();
}

// Streams one job: fetch a batch, write its events one by one, fetch the next. A fetch's
// answer can arrive after gRPC is done with the call (the client left while the answer waited
// for the journal's fsync), so the reactor is deleted by whichever lets go last: gRPC at
// OnDone, or the pending answer when the coordinator drops or runs it.
class WatchReactor : public grpc::ServerWriteReactor<v1::WatchJobEvent> {
 public:
  WatchReactor(Coordinator* c, const v1::WatchJobRequest& req)
      : c_(c),
        job_id_(req.job_id()),
        from_window_(req.from_window_id()),
        after_(req.has_after() ? std::optional<v1::RecordPosition>(req.after()) : std::nullopt),
        handle_(std::make_shared<CallHandle>()) {
    Fetch();
  }

  void OnWriteDone(bool ok) override {
    bool fetch = false;
    {
      absl::MutexLock lock(&mu_);
      if (!ok) {
        FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "the client stopped reading"));
        return;
      }
      queue_.pop_front();
      fetch = WriteNextLocked();
    }
    if (fetch) Fetch();
  }
  void OnCancel() override {
    absl::MutexLock lock(&mu_);
    FinishLocked(grpc::Status::CANCELLED);
  }
  void OnDone() override { Unref(); }

 private:
  // The pending answer's hold on the reactor: released with the last copy of the callback,
  // whether the coordinator ran it or dropped it (a claimed waiter is dropped unanswered).
  class Hold {
   public:
    explicit Hold(WatchReactor* r) : r_(r) { r_->Ref(); }
    Hold(const Hold&) = delete;
    Hold& operator=(const Hold&) = delete;
    ~Hold() { r_->Unref(); }
    WatchReactor* reactor() const { return r_; }

   private:
    WatchReactor* const r_;
  };

  void Ref() {
    absl::MutexLock lock(&mu_);
    ++refs_;
  }
  void Unref() {
    bool last = false;
    {
      absl::MutexLock lock(&mu_);
      last = --refs_ == 0;
    }
    if (last) delete this;
  }

  // The last thing its callers do: the answer may arrive inline and end the call.
  void Fetch() {
    c_->WatchJob(
        job_id_, cursor_,
        [hold = std::make_shared<Hold>(this)](absl::StatusOr<WatchBatch> batch) {
          hold->reactor()->OnBatch(batch);
        },
        handle_);
  }

  // What the request asks for: the records after `after_` (exact), else those from window
  // from_window_ on.
  bool Wanted(const v1::UpdateRecord& r) const {
    return after_.has_value() ? IsAfter(r, *after_) : r.window_id() >= from_window_;
  }

  void OnBatch(absl::StatusOr<WatchBatch>& batch) {
    bool fetch = false;
    {
      absl::MutexLock lock(&mu_);
      if (finished_) return;
      if (!batch.ok()) {
        FinishLocked(ToGrpcStatus(batch.status()));
        return;
      }
      // The job comes first in the stream's first batch (what is being watched), then after
      // the records it already reflects (a job that ended after its last record says so last).
      const bool first = cursor_.last_job_state.empty();
      if (first && batch->job.has_value()) *queue_.emplace_back().mutable_job() = *batch->job;
      for (v1::UpdateRecord& r : batch->updates) {
        if (Wanted(r)) *queue_.emplace_back().mutable_update() = std::move(r);
      }
      if (!first && batch->job.has_value()) *queue_.emplace_back().mutable_job() = *batch->job;
      cursor_ = batch->cursor;
      end_ = batch->end;
      fetch = WriteNextLocked();
    }
    if (fetch) Fetch();
  }

  // Starts the next write or finishes; returns true when the caller must Fetch.
  bool WriteNextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_) return false;
    if (!queue_.empty()) {
      StartWrite(&queue_.front());
      return false;
    }
    if (end_) {
      FinishLocked(grpc::Status::OK);
      return false;
    }
    return true;
  }

  void FinishLocked(const grpc::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_) return;
    finished_ = true;
    handle_->Claim();
    Finish(status);
  }

  Coordinator* const c_;
  const std::string job_id_;
  const int64_t from_window_;
  const std::optional<v1::RecordPosition> after_;
  const std::shared_ptr<CallHandle> handle_;
  absl::Mutex mu_;
  std::deque<v1::WatchJobEvent> queue_ ABSL_GUARDED_BY(mu_);
  WatchCursor cursor_;  // written in OnBatch, read in Fetch: one fetch is outstanding at a time
  bool end_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  int refs_ ABSL_GUARDED_BY(mu_) = 1;  // gRPC's until OnDone, plus a pending answer's
};

}  // namespace

#define TRAINSTEP_JOB_HANDLER(Method, Req, Resp, access) \
  TRAINSTEP_DEFINE_UNARY_HANDLER(JobServiceImpl, Method, Req, Resp)
TRAINSTEP_JOB_SERVICE_UNARY(TRAINSTEP_JOB_HANDLER)
#undef TRAINSTEP_JOB_HANDLER

grpc::ServerWriteReactor<v1::WatchJobEvent>* JobServiceImpl::WatchJob(
    grpc::CallbackServerContext* ctx, const v1::WatchJobRequest* req) {
  if (absl::StatusOr<Caller> caller = AuthorizeCall(auth_, ctx, "WatchJob", *req); !caller.ok()) {
    return new RefusedWriteReactor<v1::WatchJobEvent>(caller.status());
  }
  if (absl::Status s = CheckWatchRequest(*req); !s.ok()) {
    return new RefusedWriteReactor<v1::WatchJobEvent>(s);
  }
  return new WatchReactor(c_, *req);
}

}  // namespace trainstep
