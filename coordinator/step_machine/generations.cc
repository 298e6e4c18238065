// Generations and membership: forming, growing and ending a generation; draining a suspect
// worker or a straggler for a standby.
// Part of StepMachine (coordinator/step_machine.h): one concept per file.

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "coordinator/step_machine.h"

namespace trainstep {

void StepMachine::MaybeLeaveGeneration(const std::string& worker_id, absl::Time now) {
  const WorkerEntry* w = membership_.Find(worker_id);
  if (terminal() || !membership_.generation_live() || membership_.RankOf(worker_id) < 0 ||
      w->idle_after_generation < membership_.generation()) {
    return;
  }
  // A rank waiting for a later generation takes no further part in this one: end it now
  // rather than wait for the others' barriers (they would wait for this rank for ever).
  AbortInFlight(v1::WINDOW_REASON_WORKER_LOST, now);
  if (membership_.generation_live()) EndGeneration("worker left", worker_id, now);
}

void StepMachine::EndGeneration(const std::string& reason, const std::string& worker_id,
                                absl::Time now) {
  v1::JournalRecord record;
  v1::GenerationEnded* ended = record.mutable_generation_ended();
  ended->set_job_id(job_id());
  ended->set_generation(membership_.generation());
  ended->set_reason(reason);
  if (!worker_id.empty()) ended->set_worker_id(worker_id);
  Emit(std::move(record), now);
}

bool StepMachine::MembersMayChangeNow() const {
  return !terminal() && membership_.generation_live() && !eval_due_.has_value() &&
         !StopReachedAfter(last_window_, update_id_);
}

bool StepMachine::MaybeGrow(absl::Time now) {
  if (!MembersMayChangeNow() || membership_.world_size() >= job_.spec().workers().count() ||
      !StandbyReady()) {
    return false;
  }
  // At a window boundary, with workers back: the next generation takes them (up to
  // workers.count). The members finish applying this decision first, then say so. Begin
  // reports of the next window sent ahead (pipelined) do not hold this up: no rank computed
  // anything of it, and their calls are answered ABORTED like any of the ended generation.
  EndGeneration("workers joined", /*worker_id=*/"", now);
  MaybeFormGeneration(now);
  return true;
}

bool StepMachine::Takeable(const WorkerEntry& w) {
  // A standby whose compute thread is not waiting for an assignment is busy or stuck: a
  // worker fenced as hung registers again from its heartbeat thread while its compute thread
  // may still hang, and taking it would only hang the next generation.
  return !w.detached &&
         (w.phase == v1::COMPUTE_PHASE_UNSPECIFIED || w.phase == v1::COMPUTE_PHASE_IDLE);
}

bool StepMachine::StandbyReady() const {
  const std::vector<std::string> standbys = membership_.Standbys();
  return std::any_of(standbys.begin(), standbys.end(),
                     [this](const std::string& id) { return Takeable(*membership_.Find(id)); });
}

int64_t StepMachine::DetachedSurvivors() const {
  const std::vector<std::string> survivors = membership_.Survivors();
  return std::count_if(survivors.begin(), survivors.end(),
                       [this](const std::string& id) { return membership_.Find(id)->detached; });
}

bool StepMachine::MaybeDrainSuspect(absl::Time now) {
  const v1::Validate& v = job_.spec().validate();
  if (v.rerun_on().empty() || !MembersMayChangeNow()) return false;
  // A standby takes its rank, or the job goes on one rank smaller (elastic): a worker that
  // computes wrong costs more than a missing one. Below workers.min it stays, and is logged.
  if (!StandbyReady() && membership_.world_size() - 1 < job_.spec().workers().min()) {
    return false;
  }
  for (const std::string& id : membership_.Survivors()) {
    const int32_t faults = membership_.Find(id)->info.suspect_count();
    if (faults < v.max_suspect()) continue;
    Drain(id, "faulty worker drained",
          absl::StrCat("faulty: a re-run found its first run not reproduced in ", faults,
                       " windows (validate.max_suspect ", v.max_suspect(), ")"),
          now);
    return true;
  }
  return false;
}

void StepMachine::MaybeReplaceStraggler(absl::Time now) {
  const v1::Stragglers& policy = job_.spec().stragglers();
  if (!policy.has_replace_below() || !MembersMayChangeNow()) return;
  // Only with a standby to take its place: draining alone would shrink the world (or stop
  // the job below workers.min), which costs more than a slow rank does.
  if (!StandbyReady()) return;
  // The rank longest below the threshold, if its streak is long enough: one per boundary.
  std::string slowest;
  v1::RankScore worst;
  for (const std::string& id : membership_.Survivors()) {
    std::optional<v1::RankScore> score = scores_.Find(id);
    if (!score.has_value() || score->windows_below() < policy.replace_after_windows()) continue;
    if (slowest.empty() || score->windows_below() > worst.windows_below() ||
        (score->windows_below() == worst.windows_below() && score->relative() < worst.relative())) {
      slowest = id;
      worst = *score;
    }
  }
  if (slowest.empty()) return;
  Drain(slowest, "straggler replaced",
        absl::StrCat("straggler: relative score ", absl::SixDigits(worst.relative()),
                     " below stragglers.replace_below ", absl::SixDigits(policy.replace_below()),
                     " for ", worst.windows_below(), " scored windows in a row (rank ",
                     worst.rank(), "); a standby takes its place"),
        now);
}

void StepMachine::Drain(const std::string& worker_id, const std::string& why,
                        const std::string& reason, absl::Time now) {
  // At a window boundary, like a grow: the members finish applying this decision, and the
  // next generation is seeded by a survivor that holds the update, so the weights do not
  // change. The generation ends first, so begin reports sent ahead are answered ABORTED
  // without a log record, as when workers join.
  EndGeneration(why, worker_id, now);
  v1::JournalRecord record;
  v1::WorkerLost* lost = record.mutable_worker_lost();
  lost->set_job_id(job_id());
  lost->set_worker_id(worker_id);
  lost->set_reason(reason);
  lost->set_drained(true);
  Emit(std::move(record), now);
  MaybeFormGeneration(now);
}

void StepMachine::MaybeFormGeneration(absl::Time now) {
  if (terminal() || !dataset_.has_value() || membership_.generation_live()) return;
  // A worker whose stream just dropped is probably dead: building on it would only give a
  // generation that breaks again when its lease ends. It is left out until it speaks again,
  // and while it may hold the current update, nothing rolls back.
  std::vector<std::string> survivors, standbys;
  bool detached_survivor = false;
  for (const std::string& id : membership_.Survivors()) {
    if (membership_.Find(id)->detached) {
      detached_survivor = true;
    } else {
      survivors.push_back(id);
    }
  }
  for (const std::string& id : membership_.Standbys()) {
    if (Takeable(*membership_.Find(id))) standbys.push_back(id);
  }
  const size_t count = static_cast<size_t>(job_.spec().workers().count());
  const size_t available = survivors.size() + standbys.size();
  if (available < count) {
    // Short of workers.count: go on with at least workers.min. The global batch stays the
    // same; each rank runs more micro-steps, so the weights do not depend on the world size.
    if (available < static_cast<size_t>(job_.spec().workers().min())) return;
    if (!membership_.has_generation()) {
      // Workers start at different times: the first generation waits the join grace for
      // all of workers.count.
      if (!short_since_.has_value()) short_since_ = now;
      if (now < *short_since_ + JoinGrace()) return;
    } else if (detached_survivor) {
      // After a loss the job shrinks at once (a replacement joins at a window boundary), but
      // a survivor whose stream dropped settles within its lease: it comes back or is lost.
      // Waiting for it re-forms once when several ranks die together.
      return;
    }
  }
  const size_t need = std::min(available, count);

  // Survivors whose replica holds the current update come first, so rank 0 can seed the
  // others. A member of a generation that broke before it synced (its source died) holds
  // nothing: it must not seed anyone.
  std::vector<std::string> holders, others;
  bool unsettled = detached_survivor;  // a survivor that may still come to hold the update
  for (const std::string& id : survivors) {
    const WorkerEntry* w = membership_.Find(id);
    const bool holds = w->applied_update_id == update_id_;
    (holds ? holders : others).push_back(id);
    unsettled |= !holds && w->idle_after_generation < membership_.generation();
  }
  // Never roll back while a live replica may hold the current update: a survivor that has not
  // said it is idle may be applying the decision (or, after a coordinator restart, has not
  // spoken yet). Each one soon says so in a heartbeat, or its lease expires.
  if (holders.empty() && update_id_ > 0 && unsettled) return;
  v1::JournalRecord record;
  v1::GenerationFormed* f = record.mutable_generation_formed();
  f->set_job_id(job_id());
  f->set_generation(membership_.generation() + 1);
  std::vector<std::string> order = holders;
  order.insert(order.end(), others.begin(), others.end());
  order.insert(order.end(), standbys.begin(), standbys.end());
  order.resize(need);
  for (const std::string& id : order) f->add_worker_ids(id);
  v1::Assignment* a = f->mutable_assignment();
  a->set_store_prefix(absl::StrCat(job_id(), "/g", f->generation(), "/"));

  // Where the replicas' state comes from (docs/design.md, "Failure semantics").
  if (!holders.empty()) {
    a->set_state_source(v1::Assignment::BROADCAST);
    a->set_source_rank(0);
  } else if (update_id_ == 0) {
    a->set_state_source(v1::Assignment::INIT);
  } else {
    // Every replica is gone: roll back to the latest durable checkpoint (or the start).
    const v1::CheckpointRecord* resume = LatestDurableCheckpoint();
    f->set_rolled_back(true);
    if (resume != nullptr) {
      *f->mutable_rollback_to() = *resume;
      a->set_state_source(v1::Assignment::CHECKPOINT);
      a->set_checkpoint_id(resume->checkpoint_id());
    } else {
      *f->mutable_rollback_to() = checkpoints_.begin()->second;  // checkpoint 0: the initial state
      a->set_state_source(v1::Assignment::INIT);
    }
  }
  const int64_t update_id = f->rolled_back() ? f->rollback_to().optimizer_update_id() : update_id_;
  a->set_optimizer_update_id(update_id);
  a->set_scheduler_step(f->rolled_back() ? f->rollback_to().scheduler_step() : scheduler_step_);
  a->set_next_window_id((f->rolled_back() ? f->rollback_to().window_id() : last_window_) + 1);
  a->set_loss_scale(f->rolled_back() ? LossScaler(scaler_config_, f->rollback_to().scaler()).scale()
                                     : scaler_.scale());
  // A checkpoint of this state that was requested but never acknowledged is written again.
  if (std::optional<int64_t> pending = PendingCheckpointFor(update_id)) {
    a->set_pending_checkpoint_id(*pending);
  }
  // An evaluation a lost rank interrupted is run again on the same weights (a rollback past
  // it clears it in Apply: that update is evaluated when it commits again).
  if (eval_due_.has_value() && *eval_due_ == update_id) a->set_pending_eval_update_id(update_id);
  if (last_eval_.has_value() && last_eval_->optimizer_update_id() <= update_id) {
    a->set_last_eval_loss(last_eval_->eval_loss());
    a->set_last_eval_update_id(last_eval_->optimizer_update_id());
  }
  short_since_.reset();
  Emit(std::move(record), now);
}

}  // namespace trainstep
