#include "worker/link/coordinator_link.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "core/job_state.h"

namespace trainstep {

ErrorMeaning Classify(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kUnavailable:       // the coordinator restarting, a peer gone
    case absl::StatusCode::kAborted:           // a stale generation or window
    case absl::StatusCode::kDeadlineExceeded:  // a barrier or rendezvous never completed
    case absl::StatusCode::kNotFound:          // this identity was declared lost
      return ErrorMeaning::kRejoin;
    default:
      return ErrorMeaning::kFatal;
  }
}

CoordinatorLink::CoordinatorLink(WorkerControlClient* client, LinkOptions options)
    : client_(client), options_(std::move(options)) {}

CoordinatorLink::~CoordinatorLink() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    changed_.SignalAll();
  }
  attach_cancel_.Cancel();
  if (heartbeats_.joinable()) heartbeats_.join();
  if (attach_.joinable()) attach_.join();
}

absl::Status CoordinatorLink::Register() { return RegisterAs(/*again=*/false); }

absl::Status CoordinatorLink::RegisterAs(bool again) {
  static std::atomic<uint64_t> attempts{0};
  v1::RegisterWorkerRequest reg;
  reg.set_job_id(again ? job_id_ : options_.job_id);
  reg.set_name(options_.name);
  reg.set_host(options_.host);
  // Unique per attempt, also under a fake clock: a new identity, never a replayed one.
  reg.set_request_id(
      absl::StrCat(options_.name, "/", absl::ToUnixNanos(absl::Now()), "/", ++attempts));
  absl::StatusOr<v1::RegisterWorkerResponse> r = client_->RegisterWorker(reg);
  if (!r.ok()) {
    return absl::Status(r.status().code(),
                        absl::StrCat("cannot register with the coordinator at ",
                                     options_.coordinator, ": ", r.status().message()));
  }
  if (!again) {  // only before the heartbeat thread exists
    job_id_ = r->job_id();
    spec_ = r->spec();
    owner_ = r->owner();
    heartbeat_every_ = absl::Milliseconds(std::max<int64_t>(50, r->heartbeat_interval_ms()));
  }
  absl::MutexLock lock(&mu_);
  worker_id_ = r->worker_id();
  // The new identity has no dataset accepted yet: the next heartbeat reports it.
  snapshot_.dataset_accepted = false;
  LogInfo(absl::StrCat("registered", again ? " again" : "", " as ", worker_id_, " of ", job_id_,
                       " (", spec_.name(), ")"));
  return absl::OkStatus();
}

std::string CoordinatorLink::worker_id() const {
  absl::MutexLock lock(&mu_);
  return worker_id_;
}

void CoordinatorLink::StartHeartbeats() {
  heartbeats_ = std::thread([this] { HeartbeatLoop(); });
  attach_ = std::thread([this] { AttachLoop(); });
}

void CoordinatorLink::SetDataset(const v1::DatasetInfo& dataset) {
  absl::MutexLock lock(&mu_);
  dataset_ = dataset;
}

HeartbeatSnapshot CoordinatorLink::Snapshot() const {
  absl::MutexLock lock(&mu_);
  return snapshot_;
}

v1::HeartbeatRequest CoordinatorLink::NextHeartbeat() const {
  v1::HeartbeatRequest req;
  req.set_job_id(job_id_);
  req.set_applied_update_id(applied_update_);
  if (const int64_t idle = idle_after_; idle >= 0) req.set_idle_after_generation(idle);
  if (options_.compute_phase != nullptr) {
    const ComputePhase::Reading now = options_.compute_phase->Read();
    req.set_phase(now.phase);
    req.set_phase_ms(absl::ToInt64Milliseconds(now.in_phase));
  }
  absl::MutexLock lock(&mu_);
  req.set_worker_id(worker_id_);
  if (dataset_.samples() > 0 && !snapshot_.dataset_accepted) *req.mutable_dataset() = dataset_;
  return req;
}

void CoordinatorLink::HeartbeatLoop() {
  while (true) {
    uint64_t round;
    {
      absl::MutexLock lock(&mu_);
      round = ++heartbeats_sent_;
    }
    const v1::HeartbeatRequest req = NextHeartbeat();
    absl::StatusOr<v1::HeartbeatResponse> r = client_->Heartbeat(req);
    if (r.status().code() == absl::StatusCode::kNotFound && req.worker_id() == worker_id()) {
      // Declared lost (its lease expired: a partition, a pause of this process). Its replica
      // is intact: take a new identity and rejoin as a standby; the window in flight was
      // aborted for everyone, so nothing is lost.
      LogWarning(absl::StrCat(r.status().message(), "; registering again to rejoin"));
      if (absl::Status s = RegisterAs(/*again=*/true); !s.ok()) {
        LogError(s.ToString());
        Refuse(std::string(s.message()));
      }
    } else if (r.status().code() == absl::StatusCode::kFailedPrecondition) {
      // The dataset refused: this process cannot take part.
      LogError(absl::StrCat("heartbeat refused: ", r.status().message()));
      Refuse(std::string(r.status().message()));
    } else {
      Publish(r, req.worker_id());
    }
    absl::MutexLock lock(&mu_);
    heartbeats_answered_ = round;
    changed_.SignalAll();
    const absl::Time sent = absl::Now();
    while (!stop_ && !heartbeat_now_) {
      // Re-read on every wake-up: an urgent waiter may have arrived meanwhile.
      const absl::Duration pace = !r.ok()               ? options_.retry_every
                                  : urgent_waiters_ > 0 ? options_.urgent_every
                                                        : heartbeat_every_;
      if (changed_.WaitWithDeadline(&mu_, sent + pace)) break;  // due
    }
    if (stop_) return;
    heartbeat_now_ = false;
  }
}

void CoordinatorLink::AttachLoop() {
  while (true) {
    v1::AttachRequest req;
    req.set_job_id(job_id_);
    req.set_worker_id(worker_id());
    const absl::Status ended = client_->Attach(
        req, [this, &req](const v1::HeartbeatResponse& place) { Publish(place, req.worker_id()); },
        &attach_cancel_);
    if (ended.code() == absl::StatusCode::kUnimplemented) {
      LogWarning(absl::StrCat("the coordinator at ", options_.coordinator,
                              " has no Attach stream (an older version): a dead worker is then "
                              "noticed only when its lease expires"));
      return;
    }
    absl::MutexLock lock(&mu_);
    if (stop_) return;
    // Whatever ended it (the coordinator restarting, this identity declared lost), the
    // heartbeat learns what to do now rather than at its next beat.
    heartbeat_now_ = true;
    changed_.SignalAll();
    changed_.WaitWithTimeout(&mu_, options_.retry_every);
    if (stop_) return;
  }
}

void CoordinatorLink::Publish(const absl::StatusOr<v1::HeartbeatResponse>& answer,
                              const std::string& from) {
  absl::MutexLock lock(&mu_);
  if (from != worker_id_) return;  // about an identity this process no longer has
  HeartbeatSnapshot& s = snapshot_;
  ++s.version;
  s.last_error = answer.status();
  if (answer.ok() && answer->coordinator_id() == s.coordinator_id &&
      answer->state_version() < s.state_version) {
    // An older answer than the one applied (a heartbeat overtaken by a pushed place): it would
    // undo a newer assignment and end a generation this worker is still in.
    s.last_error = absl::OkStatus();
    changed_.SignalAll();
    return;
  }
  if (answer.ok()) {
    const v1::HeartbeatResponse& r = *answer;
    s.state_version = r.state_version();
    s.job_state = r.job_state();
    s.job_message = r.job_message();
    s.job_over = s.job_over || IsTerminal(r.job_state());
    s.dataset_accepted = r.dataset_accepted();
    // Heartbeat answers carry them; pushed places do not (they would push every window).
    if (r.hang_deadline_ms() > 0 && options_.compute_phase != nullptr) {
      options_.compute_phase->SetDeadlines(absl::Milliseconds(r.hang_deadline_ms()),
                                           absl::Milliseconds(r.hang_cap_ms()));
    }
    if (!r.drained().empty()) s.drained = r.drained();
    if (!r.coordinator_id().empty()) s.coordinator_id = r.coordinator_id();
    s.current_generation = r.assigned() ? r.assignment().generation() : -1;
    if (r.assigned()) {
      s.assignment = r.assignment();
      s.assignment_worker_id = worker_id_;
    } else {
      s.assignment.reset();
    }
  }
  changed_.SignalAll();
}

void CoordinatorLink::Refuse(const std::string& message) {
  absl::MutexLock lock(&mu_);
  ++snapshot_.version;
  snapshot_.refused = true;
  snapshot_.job_message = message;
  changed_.SignalAll();
}

HeartbeatSnapshot CoordinatorLink::AwaitNewer(uint64_t version, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  ++urgent_waiters_;
  changed_.SignalAll();  // the heartbeat thread takes the urgent pace now
  const absl::Time deadline = absl::Now() + timeout;
  while (snapshot_.version <= version && !stop_) {
    if (changed_.WaitWithDeadline(&mu_, deadline)) break;  // timed out
  }
  --urgent_waiters_;
  return snapshot_;
}

HeartbeatSnapshot CoordinatorLink::Fresh(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  const uint64_t sent_before = heartbeats_sent_;  // one in flight may predate the question
  heartbeat_now_ = true;
  changed_.SignalAll();
  const absl::Time deadline = absl::Now() + timeout;
  while (heartbeats_answered_ <= sent_before && !stop_) {
    if (changed_.WaitWithDeadline(&mu_, deadline)) break;  // timed out
  }
  return snapshot_;
}

absl::StatusOr<v1::Assignment> CoordinatorLink::AwaitAssignment(int64_t after_generation) {
  // Nothing more reaches the replica until the next assignment: the heartbeats say so, and
  // the coordinator may then conclude that it does not hold the job's current update.
  idle_after_ = after_generation;
  // A fresh answer, not one from before the call; but refusal and the job's end are final.
  HeartbeatSnapshot s = Snapshot();
  uint64_t seen = s.refused || s.job_over || !s.drained.empty() ? s.version - 1 : s.version;
  while (true) {
    s = AwaitNewer(seen, absl::Seconds(1));
    seen = s.version;
    if (s.refused) return absl::FailedPreconditionError(s.job_message);
    if (!s.drained.empty()) {
      return absl::CancelledError(absl::StrCat("drained by the coordinator: ", s.drained));
    }
    if (s.job_over) {
      return absl::CancelledError(absl::StrCat("job ", v1::JobState_Name(s.job_state),
                                               s.job_message.empty() ? "" : ": ", s.job_message));
    }
    if (s.assignment.has_value() && s.assignment->generation() > after_generation) {
      joined_generation_ = s.assignment->generation();
      joined_for_waits_ = joined_generation_;
      idle_after_ = -1;
      member_id_ = s.assignment_worker_id;
      return *s.assignment;
    }
    if (!s.last_error.ok() && Classify(s.last_error) == ErrorMeaning::kFatal) {
      return s.last_error;
    }
  }
}

bool CoordinatorLink::KeepWaiting() const {
  const int64_t joined = joined_for_waits_.load();
  absl::MutexLock lock(&mu_);
  if (snapshot_.job_over || snapshot_.refused || !snapshot_.drained.empty()) return false;
  return !(joined > 0 && snapshot_.current_generation != joined);
}

absl::Status CoordinatorLink::AwaitJobEnd(absl::Duration give_up) {
  const absl::Time until = options_.clock->Now() + give_up;
  uint64_t seen = 0;
  while (true) {
    const HeartbeatSnapshot s = AwaitNewer(seen, options_.urgent_every);
    seen = s.version;
    if (s.job_over) return absl::OkStatus();
    if (s.refused) return absl::FailedPreconditionError(s.job_message);
    if (options_.clock->Now() >= until) {
      return absl::DeadlineExceededError(absl::StrCat(
          "the job did not end within ", absl::FormatDuration(give_up), " after its last window"));
    }
  }
}

void CoordinatorLink::ReportFailure(const absl::Status& status) {
  LogError(status.ToString());
  if (job_id_.empty()) return;
  v1::ReportFailureRequest req;
  req.set_job_id(job_id_);
  req.set_worker_id(worker_id());
  req.set_message(std::string(status.message()));
  (void)client_->ReportFailure(req);
}

absl::Status CoordinatorLink::ReportDamagedCheckpoint(int64_t checkpoint_id,
                                                      const absl::Status& why) {
  LogError(absl::StrCat("checkpoint ", checkpoint_id, " cannot be loaded: ", why.message(),
                        "; the job rolls back past it"));
  v1::ReportFailureRequest req;
  req.set_job_id(job_id_);
  req.set_worker_id(worker_id());
  req.set_message(std::string(why.message()));
  req.set_damaged_checkpoint_id(checkpoint_id);
  return client_->ReportFailure(req);
}

}  // namespace trainstep
