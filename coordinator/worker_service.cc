#include "coordinator/worker_service.h"

#include <atomic>

namespace trainstep {
namespace {

// One worker's Attach stream: the worker's place whenever it changes, until the worker or this
// server ends the call. The end of a stream the coordinator did not end is news: the process
// on the other side died, or its connection did (Coordinator::Detached).
class AttachReactor : public grpc::ServerWriteReactor<v1::AttachEvent> {
 public:
  AttachReactor(Coordinator* c, const v1::AttachRequest& req)
      : c_(c), req_(req), seq_(++next_seq_), state_(std::make_shared<State>()) {
    state_->reactor = this;
    Fetch();
  }

  void OnWriteDone(bool ok) override {
    {
      absl::MutexLock lock(&state_->mu);
      if (state_->finished) return;
      if (!ok) {
        FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "the worker stopped reading"));
        return;
      }
    }
    Fetch();
  }
  void OnCancel() override {
    {
      absl::MutexLock lock(&state_->mu);
      if (state_->finished) return;
      FinishLocked(grpc::Status::CANCELLED);
    }
    c_->Detached(req_, seq_);
  }
  void OnDone() override {
    {
      absl::MutexLock lock(&state_->mu);
      state_->reactor = nullptr;  // an answer still on its way finds nobody
    }
    delete this;
  }

 private:
  // What the coordinator's answer reaches, also after the reactor is gone.
  struct State {
    absl::Mutex mu;
    AttachReactor* reactor ABSL_GUARDED_BY(mu) = nullptr;
    bool finished ABSL_GUARDED_BY(mu) = false;
  };

  // The last thing its callers do: the answer may arrive inline.
  void Fetch() {
    c_->Attach(
        req_, seq_, last_sent_,
        [state = state_](absl::StatusOr<v1::HeartbeatResponse> place) {
          absl::MutexLock lock(&state->mu);
          if (state->reactor == nullptr || state->finished) return;
          state->reactor->OnPlaceLocked(place);
        },
        handle_);
  }

  void OnPlaceLocked(absl::StatusOr<v1::HeartbeatResponse>& place)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_->mu) {
    if (!place.ok()) {
      FinishLocked(ToGrpcStatus(place.status()));
      return;
    }
    last_sent_ = PlaceKey(*place);
    *event_.mutable_place() = std::move(*place);
    StartWrite(&event_);
  }

  void FinishLocked(const grpc::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_->mu) {
    state_->finished = true;
    handle_->Claim();  // the coordinator stops polling this stream
    Finish(status);
  }

  static inline std::atomic<uint64_t> next_seq_{0};
  Coordinator* const c_;
  const v1::AttachRequest req_;
  const uint64_t seq_;
  const std::shared_ptr<State> state_;
  const std::shared_ptr<CallHandle> handle_ = std::make_shared<CallHandle>();
  std::string last_sent_;  // one poll or write is outstanding at a time
  v1::AttachEvent event_;
};

}  // namespace

grpc::ServerWriteReactor<v1::AttachEvent>* WorkerServiceImpl::Attach(
    grpc::CallbackServerContext* ctx, const v1::AttachRequest* req) {
  if (absl::StatusOr<Caller> caller = AuthorizeCall(auth_, ctx, "Attach", *req); !caller.ok()) {
    return new RefusedWriteReactor<v1::AttachEvent>(caller.status());
  }
  return new AttachReactor(c_, *req);
}

#define TRAINSTEP_WORKER_HANDLER(Method, Req, Resp, access) \
  TRAINSTEP_DEFINE_UNARY_HANDLER(WorkerServiceImpl, Method, Req, Resp)
TRAINSTEP_WORKER_SERVICE_UNARY(TRAINSTEP_WORKER_HANDLER)
#undef TRAINSTEP_WORKER_HANDLER

}  // namespace trainstep
