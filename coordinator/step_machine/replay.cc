// Replay: Apply, the one place durable state changes, shared by live running and by the
// journal's replay on restart; CheckFollows, which refuses a record the machine could not have
// emitted; Restore and Snapshot.
// Part of StepMachine (coordinator/step_machine.h): one concept per file.

#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "coordinator/step_machine.h"
#include "core/job_state.h"
#include "core/window_outcome.h"

namespace trainstep {

namespace {

// The latest evaluation is the newest update record that carries one. Replay and Restore both
// read it from the log, so a restored machine cannot disagree with the one it was taken from.
std::optional<v1::EvalEnded> LatestEval(const std::vector<v1::UpdateRecord>& updates,
                                        const std::string& job_id) {
  for (auto it = updates.rbegin(); it != updates.rend(); ++it) {
    if (!it->has_eval_loss()) continue;
    v1::EvalEnded e;
    e.set_job_id(job_id);
    e.set_generation(it->generation());
    e.set_optimizer_update_id(it->optimizer_update_id());
    e.set_eval_loss(it->eval_loss());
    e.set_valid_units(it->eval_valid_tokens());
    return e;
  }
  return std::nullopt;
}

}  // namespace

void StepMachine::OutcomeCounts::Add(const v1::UpdateRecord& r) {
  switch (OutcomeOf(r)) {
    case v1::COMMIT:
      ++committed;
      last_loss = r.loss();
      break;
    case v1::SKIP:
      ++skipped;
      break;
    default:
      ++aborted;
      break;
  }
  if (r.has_rerun()) {
    ++reruns;
    if (VerdictOf(r.rerun()) == v1::RERUN_VERDICT_TRANSIENT) ++reruns_transient;
  }
}

std::unique_ptr<StepMachine> StepMachine::FromSubmitted(const MachineOptions& options,
                                                        const v1::JobSubmitted& submitted) {
  return std::unique_ptr<StepMachine>(new StepMachine(options, submitted.job()));
}

std::unique_ptr<StepMachine> StepMachine::Restore(const MachineOptions& options,
                                                  const v1::JobSnapshot& snap, absl::Time now) {
  std::unique_ptr<StepMachine> m(new StepMachine(options, snap.job()));
  m->scaler_ = LossScaler(m->scaler_config_, snap.scaler());
  m->updates_.assign(snap.updates().begin(), snap.updates().end());
  for (const v1::UpdateRecord& r : m->updates_) {
    m->counts_.Add(r);
    m->goodput_.Add(r);
  }
  m->RefreshSlowestRecentWindow();
  m->last_eval_ = LatestEval(m->updates_, snap.job().job_id());
  if (snap.has_eval_due_update_id()) m->eval_due_ = snap.eval_due_update_id();
  m->membership_.Restore({snap.workers().begin(), snap.workers().end()}, snap.generation(),
                         now + options.worker_lease);
  if (snap.has_dataset()) {
    m->dataset_ = snap.dataset();
    m->planner_ = std::make_unique<WindowPlanner>(snap.job().spec(), snap.dataset().samples());
  }
  m->windows_per_epoch_ = snap.job().progress().windows_per_epoch();
  m->checkpoints_.clear();
  for (const v1::CheckpointRecord& c : snap.checkpoints()) m->checkpoints_[c.checkpoint_id()] = c;
  m->recent_decisions_.assign(snap.recent_decisions().begin(), snap.recent_decisions().end());
  m->next_checkpoint_id_ = snap.next_checkpoint_id();
  const v1::JobProgress& p = snap.job().progress();
  m->last_window_ = p.window_id();
  m->update_id_ = p.optimizer_update_id();
  m->scheduler_step_ = p.scheduler_step();
  m->checkpoint_id_ = p.checkpoint_id();
  m->cumulative_tokens_ = p.cumulative_tokens();
  m->micro_step_id_ = p.micro_step_id();
  m->rollbacks_ = p.rollbacks();
  m->hangs_ = p.hangs();
  m->last_hang_ = p.last_hang();
  m->RefreshDroppedTail();
  for (auto it = m->updates_.rbegin(); it != m->updates_.rend(); ++it) {
    if (OutcomeOf(*it) == v1::COMMIT) {
      m->last_commit_ms_ = it->end_time_ms();
      break;
    }
  }
  // Derivable state: consecutive desync aborts at the end of the log.
  for (auto it = m->updates_.rbegin(); it != m->updates_.rend(); ++it) {
    if (OutcomeOf(*it) != v1::ABORT) break;
    if (ReasonCodeOf(*it) == v1::WINDOW_REASON_DESYNC) ++m->consecutive_desyncs_;
  }
  return m;
}

void StepMachine::Apply(const v1::JournalRecord& record) {
  ++version_;
  const absl::Time now = absl::FromUnixMillis(record.time_ms());
  switch (record.kind_case()) {
    case v1::JournalRecord::kJobSubmitted:
      break;  // the registry builds the machine from it
    case v1::JournalRecord::kJobEnded: {
      job_.set_state(record.job_ended().state());
      job_.set_message(record.job_ended().message());
      job_.set_end_time_ms(record.time_ms());
      attempts_.clear();
      break;
    }
    case v1::JournalRecord::kWorkerRegistered:
      membership_.Add(record.worker_registered().worker(), record.worker_registered().request_id(),
                      now + options_.worker_lease);
      break;
    case v1::JournalRecord::kDatasetAccepted: {
      const v1::DatasetAccepted& d = record.dataset_accepted();
      if (!dataset_.has_value()) {
        dataset_ = d.dataset();
        *job_.mutable_model_config() = d.dataset().model_config();
        windows_per_epoch_ = d.windows_per_epoch();
        planner_ = std::make_unique<WindowPlanner>(job_.spec(), d.dataset().samples());
      }
      membership_.AcceptDataset(d.worker_id());
      break;
    }
    case v1::JournalRecord::kWorkerLost:
      membership_.MarkLost(record.worker_lost().worker_id(), record.time_ms());
      if (record.worker_lost().drained()) {
        membership_.MarkDrained(record.worker_lost().worker_id(), record.worker_lost().reason());
      }
      if (record.worker_lost().hung_phase() != v1::COMPUTE_PHASE_UNSPECIFIED) {
        ++hangs_;
        last_hang_ =
            absl::StrCat(record.worker_lost().worker_id(), " ", record.worker_lost().reason());
      }
      break;
    case v1::JournalRecord::kGenerationFormed:
      ApplyGenerationFormed(record.generation_formed(), record.time_ms());
      break;
    case v1::JournalRecord::kGenerationEnded: {
      const v1::GenerationEnded& ended = record.generation_ended();
      if (ended.generation() == membership_.generation()) {
        membership_.BreakGeneration();
        attempts_.clear();
      }
      if (ended.has_damaged_checkpoint_id()) {
        auto it = checkpoints_.find(ended.damaged_checkpoint_id());
        if (it != checkpoints_.end()) it->second.set_damaged(true);
      }
      break;
    }
    case v1::JournalRecord::kWindowEnded:
      ApplyWindowEnded(record.window_ended());
      break;
    case v1::JournalRecord::kEvalEnded:
      ApplyEvalEnded(record.eval_ended());
      break;
    case v1::JournalRecord::kCheckpointDurable: {
      auto it = checkpoints_.find(record.checkpoint_durable().checkpoint_id());
      if (it != checkpoints_.end()) {
        it->second.set_durable(true);
        it->second.set_path(record.checkpoint_durable().path());
      }
      break;
    }
    case v1::JournalRecord::kJobForgotten:  // the registry's record
    case v1::JournalRecord::KIND_NOT_SET:
      break;
  }
}

absl::Status StepMachine::CheckFollows(const v1::JournalRecord& record) const {
  const auto known_worker = [this](const std::string& id) -> absl::Status {
    if (membership_.Find(id) == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("it names worker '", id, "', which job ", job_id(), " does not have"));
    }
    return absl::OkStatus();
  };
  switch (record.kind_case()) {
    case v1::JournalRecord::kJobSubmitted:
      return absl::FailedPreconditionError(absl::StrCat("job ", job_id(), " is already submitted"));
    case v1::JournalRecord::kJobEnded:
      if (terminal()) {
        return absl::FailedPreconditionError(absl::StrCat("job ", job_id(), " already ended (",
                                                          v1::JobState_Name(job_.state()), ")"));
      }
      if (!IsTerminal(record.job_ended().state())) {
        return absl::FailedPreconditionError(absl::StrCat(
            "it ends the job in state ", v1::JobState_Name(record.job_ended().state())));
      }
      return absl::OkStatus();
    case v1::JournalRecord::kWorkerRegistered:
      if (membership_.Find(record.worker_registered().worker().worker_id()) != nullptr) {
        return absl::FailedPreconditionError(
            absl::StrCat("worker '", record.worker_registered().worker().worker_id(),
                         "' is already registered with job ", job_id()));
      }
      return absl::OkStatus();
    case v1::JournalRecord::kDatasetAccepted:
      return known_worker(record.dataset_accepted().worker_id());
    case v1::JournalRecord::kWorkerLost:
      return known_worker(record.worker_lost().worker_id());
    case v1::JournalRecord::kGenerationFormed: {
      const v1::GenerationFormed& f = record.generation_formed();
      if (terminal()) return absl::FailedPreconditionError("the job already ended");
      if (f.generation() != membership_.generation() + 1) {
        return absl::FailedPreconditionError(absl::StrCat("it forms generation ", f.generation(),
                                                          " after generation ",
                                                          membership_.generation()));
      }
      if (f.worker_ids().empty()) return absl::FailedPreconditionError("it names no worker");
      absl::flat_hash_set<std::string> seen;
      for (const std::string& id : f.worker_ids()) {
        RETURN_IF_ERROR(known_worker(id));
        if (membership_.Find(id)->info.state() == v1::LOST) {
          return absl::FailedPreconditionError(absl::StrCat("worker '", id, "' is lost"));
        }
        if (!seen.insert(id).second) {
          return absl::FailedPreconditionError(absl::StrCat("it names worker '", id, "' twice"));
        }
      }
      if (f.rolled_back() && checkpoints_.count(f.rollback_to().checkpoint_id()) == 0) {
        return absl::FailedPreconditionError(absl::StrCat(
            "it rolls back to checkpoint ", f.rollback_to().checkpoint_id(), ", which is unknown"));
      }
      return absl::OkStatus();
    }
    case v1::JournalRecord::kWindowEnded: {
      const v1::WindowDecision& d = record.window_ended().decision();
      const v1::UpdateRecord& r = d.record();
      if (terminal()) return absl::FailedPreconditionError("the job already ended");
      if (!membership_.has_generation() || r.generation() != membership_.generation()) {
        return absl::FailedPreconditionError(
            absl::StrCat("it ends a window of generation ", r.generation(),
                         " while the job is in generation ", membership_.generation()));
      }
      if (r.window_id() != last_window_ + 1) {
        return absl::FailedPreconditionError(
            absl::StrCat("it ends window ", r.window_id(), " after window ", last_window_));
      }
      const int64_t advance = d.outcome() == v1::COMMIT ? 1 : 0;
      if (d.outcome() != v1::ABORT && (d.optimizer_update_id() != update_id_ + advance ||
                                       d.scheduler_step() != scheduler_step_ + advance)) {
        return absl::FailedPreconditionError(
            absl::StrCat("its ", OutcomeName(d.outcome()), " leaves optimizer update ",
                         d.optimizer_update_id(), " and scheduler step ", d.scheduler_step(),
                         " after ", update_id_, " and ", scheduler_step_));
      }
      return absl::OkStatus();
    }
    case v1::JournalRecord::kEvalEnded:
    case v1::JournalRecord::kGenerationEnded:
    case v1::JournalRecord::kCheckpointDurable:
    case v1::JournalRecord::kJobForgotten:
    case v1::JournalRecord::KIND_NOT_SET:
      return absl::OkStatus();  // Apply makes nothing of one that does not fit
  }
  return absl::OkStatus();
}

void StepMachine::ApplyGenerationFormed(const v1::GenerationFormed& formed, int64_t time_ms) {
  if (formed.rolled_back()) {
    ++rollbacks_;
    const v1::CheckpointRecord& to = formed.rollback_to();
    last_window_ = to.window_id();
    update_id_ = to.optimizer_update_id();
    scheduler_step_ = to.scheduler_step();
    cumulative_tokens_ = to.cumulative_tokens();
    micro_step_id_ = to.micro_step_id();
    checkpoint_id_ = to.checkpoint_id();
    RefreshDroppedTail();
    scaler_ = LossScaler(scaler_config_, to.scaler());
    // Checkpoints requested after the rollback point can never be written: their state is gone.
    checkpoints_.erase(checkpoints_.upper_bound(to.checkpoint_id()), checkpoints_.end());
    // So can evaluations of updates past it; the update is evaluated when it commits again.
    if (eval_due_.has_value() && *eval_due_ > to.optimizer_update_id()) eval_due_.reset();
  }
  eval_attempt_.reset();  // reports of the old generation count for nothing
  membership_.FormGeneration(formed);
  attempts_.clear();
  if (job_.state() == v1::PENDING) {
    job_.set_state(v1::RUNNING);
    job_.set_start_time_ms(time_ms);
  }
}

void StepMachine::ApplyWindowEnded(const v1::WindowEnded& ended) {
  const v1::WindowDecision& d = ended.decision();
  const v1::UpdateRecord& r = d.record();
  updates_.push_back(r);
  RefreshSlowestRecentWindow();
  counts_.Add(r);
  goodput_.Add(r);
  if (VerdictOf(r.rerun()) == v1::RERUN_VERDICT_TRANSIENT) {
    for (const std::string& id : r.rerun().worker_ids()) membership_.AddSuspect(id);
  }
  recent_decisions_.push_back(d);
  if (recent_decisions_.size() > options_.recent_decisions) {
    recent_decisions_.erase(recent_decisions_.begin());
  }
  switch (d.outcome()) {
    case v1::COMMIT:
      update_id_ = d.optimizer_update_id();
      scheduler_step_ = d.scheduler_step();
      cumulative_tokens_ = r.cumulative_tokens();
      last_commit_ms_ = r.end_time_ms();
      [[fallthrough]];
    case v1::SKIP:
      last_window_ = r.window_id();
      micro_step_id_ = r.micro_step_id();
      consecutive_desyncs_ = 0;
      attempts_.erase(r.window_id());
      RefreshDroppedTail();
      break;
    case v1::ABORT:
      if (ReasonCodeOf(r) == v1::WINDOW_REASON_DESYNC) ++consecutive_desyncs_;
      // Nothing of this generation's windows in flight can end any more.
      membership_.BreakGeneration();
      attempts_.clear();
      break;
    default:
      break;
  }
  scaler_ = LossScaler(scaler_config_, ended.scaler_after());
  if (d.run_eval()) {
    eval_due_ = d.optimizer_update_id();
    eval_attempt_.reset();
  }
  if (ended.has_checkpoint_assigned()) {
    const v1::CheckpointRecord& c = ended.checkpoint_assigned();
    checkpoints_[c.checkpoint_id()] = c;
    checkpoint_id_ = c.checkpoint_id();
    next_checkpoint_id_ = std::max(next_checkpoint_id_, c.checkpoint_id() + 1);
  }
}

void StepMachine::ApplyEvalEnded(const v1::EvalEnded& ended) {
  // The evaluation belongs to the newest commit of that update (an earlier one may have been
  // rolled back and committed again). One of no committed update fits nothing and changes
  // nothing (only a damaged journal has one: the journal_replay fuzzer's finding).
  auto it = std::find_if(updates_.rbegin(), updates_.rend(), [&](const v1::UpdateRecord& r) {
    return OutcomeOf(r) == v1::COMMIT && r.optimizer_update_id() == ended.optimizer_update_id();
  });
  if (it == updates_.rend()) return;
  it->set_eval_loss(ended.eval_loss());
  it->set_eval_valid_tokens(ended.valid_units());
  last_eval_ = LatestEval(updates_, job_id());
  if (eval_due_ == ended.optimizer_update_id()) eval_due_.reset();
  eval_attempt_.reset();
}

v1::JobSnapshot StepMachine::Snapshot() const {
  v1::JobSnapshot s;
  *s.mutable_job() = Job();
  *s.mutable_scaler() = scaler_.State();
  for (const v1::UpdateRecord& r : updates_) *s.add_updates() = r;
  for (v1::WorkerSnapshot& w : membership_.Snapshot()) *s.add_workers() = std::move(w);
  if (membership_.has_generation()) *s.mutable_generation() = membership_.current();
  if (dataset_.has_value()) *s.mutable_dataset() = *dataset_;
  for (const auto& [id, c] : checkpoints_) *s.add_checkpoints() = c;
  for (const v1::WindowDecision& d : recent_decisions_) *s.add_recent_decisions() = d;
  s.set_next_checkpoint_id(next_checkpoint_id_);
  if (eval_due_.has_value()) s.set_eval_due_update_id(*eval_due_);
  return s;
}

void StepMachine::RefreshDroppedTail() {
  const int64_t epochs_ended = EpochOf(last_window_ + 1);
  if (planner_ == nullptr || planner_->dropped_per_epoch() == 0 || epochs_ended == 0) {
    last_dropped_tail_.reset();
  } else if (!last_dropped_tail_.has_value() || last_dropped_tail_->epoch() != epochs_ended - 1) {
    last_dropped_tail_ = planner_->DroppedTail(epochs_ended - 1);
  }
}

void StepMachine::MarkReplaced(const std::string& worker_id, const std::string& by) {
  membership_.MarkReplaced(worker_id, by);
}

}  // namespace trainstep
