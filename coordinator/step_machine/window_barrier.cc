// The window barrier: begin and complete reports, the units counted once per rank, and the
// answers a barrier gives when every rank has reported.
// Part of StepMachine (coordinator/step_machine.h): one concept per file.

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/proto_bytes.h"
#include "common/status_macros.h"
#include "coordinator/lr_schedule.h"
#include "coordinator/report_validation.h"
#include "coordinator/step_machine.h"

namespace trainstep {

const v1::WindowDecision* StepMachine::FindDecision(int64_t generation, int64_t window_id) const {
  for (auto it = recent_decisions_.rbegin(); it != recent_decisions_.rend(); ++it) {
    if (it->record().generation() == generation && it->record().window_id() == window_id) {
      return &*it;
    }
  }
  return nullptr;
}

absl::StatusOr<StepMachine::Attempt*> StepMachine::AttemptFor(int64_t window_id) {
  const int64_t next = last_window_ + 1;
  if (window_id < next) {
    return absl::AbortedError(
        absl::StrCat("window ", window_id, " already ended; the next window is ", next));
  }
  if (window_id > next + 1) {
    return absl::FailedPreconditionError(
        absl::StrCat("window ", window_id, " is ahead of the protocol; the next window is ", next));
  }
  if (StopReachedAfter(window_id - 1, update_id_)) {
    return absl::FailedPreconditionError(
        absl::StrCat("training is done: there is no window ", window_id));
  }
  auto [it, inserted] = attempts_.try_emplace(window_id);
  if (inserted) {
    it->second.window_id = window_id;
    it->second.units.resize(membership_.world_size());
    it->second.complete.resize(membership_.world_size());
  }
  return &it->second;
}

absl::Status StepMachine::RecordUnits(Attempt* attempt, int32_t rank, int64_t units) {
  std::optional<int64_t>& slot = attempt->units[rank];
  if (slot.has_value()) {
    if (*slot != units) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " reported ", *slot,
                                                     " valid units for window ", attempt->window_id,
                                                     " and now ", units));
    }
    return absl::OkStatus();
  }
  if (units > kMaxUnits - attempt->total_units) {
    return absl::InvalidArgumentError(absl::StrCat(
        "valid_units ", units, " of rank ", rank, " would make window ", attempt->window_id,
        "'s total over the ranks exceed 2^53 (", attempt->total_units, " reported so far)"));
  }
  slot = units;
  ++attempt->units_reported;
  attempt->total_units += units;
  // Waiters only care when the barrier can resolve; a partial count wakes nobody.
  if (attempt->units_reported == static_cast<int32_t>(attempt->units.size())) ++version_;
  return absl::OkStatus();
}

bool StepMachine::BarrierReady(const Attempt& attempt) const {
  // No window starts before the weights it would change are evaluated.
  return attempt.window_id == last_window_ + 1 && !eval_due_.has_value() &&
         attempt.units_reported == static_cast<int32_t>(attempt.units.size());
}

absl::Status StepMachine::CheckBeginBarrierPassed(const Attempt& attempt,
                                                  const v1::CompleteWindowRequest& req) const {
  if (attempt.units_reported == static_cast<int32_t>(attempt.units.size())) {
    return absl::OkStatus();
  }
  // A repeat of a CompleteWindow already accepted (the client re-sends while it waits).
  if (attempt.complete[req.rank()].has_value()) return absl::OkStatus();
  if (attempt.units[req.rank()].has_value()) {
    // This rank is still waiting at the begin barrier: it cannot know N yet.
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", req.rank(), " sent CompleteWindow for window ", req.window_id(),
                     " before the window's begin barrier completed (BeginWindow answers N first)"));
  }
  // Only the window in flight when this coordinator recovered can have had its begin barrier
  // answered by the previous one; for it, the report stands for the lost BeginWindow.
  if (req.window_id() == recovered_window_ && req.generation() == recovered_generation_) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "rank ", req.rank(), " sent CompleteWindow for window ", req.window_id(),
      " without a BeginWindow: N comes from the begin barrier (a CompleteWindow stands for a "
      "BeginWindow only for the window in flight when the coordinator restarted)"));
}

v1::BeginWindowResponse StepMachine::BarrierResponse(const Attempt& attempt) const {
  v1::BeginWindowResponse r;
  r.set_global_valid_units(attempt.total_units);
  r.set_loss_scale(scaler_.scale());
  r.set_learning_rate(LearningRate(job_.spec(), scheduler_step_));
  r.set_scheduler_step(scheduler_step_);
  r.set_optimizer_update_id(update_id_);
  r.set_epoch(EpochOf(attempt.window_id));
  return r;
}

absl::StatusOr<Answer<v1::BeginWindowResponse>> StepMachine::BeginWindow(
    const v1::BeginWindowRequest& req, absl::Time now) {
  RETURN_IF_ERROR(ValidateBeginWindow(req));
  Answer<v1::BeginWindowResponse> answer;
  if (const v1::WindowDecision* d = FindDecision(req.generation(), req.window_id())) {
    return DecidedAtBegin(*d);
  }
  RETURN_IF_ERROR(CheckRunnable());
  RETURN_IF_ERROR(CheckMember(req.worker_id(), req.generation(), req.rank()));
  ASSIGN_OR_RETURN(Attempt * attempt, AttemptFor(req.window_id()));
  if (!attempt->has_any_report()) attempt->first_report = now;
  const bool first_of_rank = !attempt->units[req.rank()].has_value();
  RETURN_IF_ERROR(RecordUnits(attempt, req.rank(), req.valid_units()));
  // A rank starts window w only after applying every decision before it. Not a report sent
  // ahead while w-1 was open (pipelined), polled again once w-1 is decided: that rank may not
  // have the decision yet.
  if (first_of_rank && req.window_id() == last_window_ + 1) {
    membership_.NoteApplied(req.worker_id(), update_id_);
  }
  if (!BarrierReady(*attempt)) return answer;
  MaybeEndEmptyWindow(now);
  if (const v1::WindowDecision* d = FindDecision(req.generation(), req.window_id())) {
    return DecidedAtBegin(*d);  // ended at its barrier (empty): as a repeated call gets it
  }
  answer.ready = true;
  answer.response = BarrierResponse(*attempt);
  return answer;
}

Answer<v1::BeginWindowResponse> StepMachine::DecidedAtBegin(const v1::WindowDecision& d) {
  Answer<v1::BeginWindowResponse> answer;
  answer.ready = true;
  answer.response.set_global_valid_units(d.record().global_valid_tokens());
  answer.response.set_learning_rate(d.learning_rate());
  *answer.response.mutable_decision() = d;
  return answer;
}

absl::StatusOr<Answer<v1::CompleteWindowResponse>> StepMachine::CompleteWindow(
    const v1::CompleteWindowRequest& req, absl::Time now) {
  RETURN_IF_ERROR(ValidateCompleteWindow(req));
  ASSIGN_OR_RETURN(Answer<v1::CompleteWindowResponse> answer, ReportComplete(req, now));
  // The next window's begin answer rides back with the decision when its barrier passed in the
  // same round. Otherwise (an ABORT, the job's end, a barrier held for an evaluation) it stays
  // out: the worker sends that BeginWindow itself, and its report counts once. Only a report
  // counted before the decision (ReportComplete) is answered here: one counted after it would
  // claim this rank applied a decision it has not received yet.
  if (answer.ready && req.has_next() && CountedAhead(req.next())) {
    absl::StatusOr<Answer<v1::BeginWindowResponse>> next = BeginWindow(req.next(), now);
    if (next.ok() && next->ready) *answer.response.mutable_next() = std::move(next->response);
  }
  return answer;
}

bool StepMachine::CountedAhead(const v1::BeginWindowRequest& next) const {
  if (FindDecision(next.generation(), next.window_id()) != nullptr) return true;  // ended empty
  auto it = attempts_.find(next.window_id());
  if (it == attempts_.end() || next.rank() >= static_cast<int32_t>(it->second.units.size())) {
    return false;
  }
  return it->second.units[next.rank()].has_value();
}

absl::StatusOr<Answer<v1::CompleteWindowResponse>> StepMachine::ReportComplete(
    const v1::CompleteWindowRequest& req, absl::Time now) {
  Answer<v1::CompleteWindowResponse> answer;
  if (const v1::WindowDecision* d = FindDecision(req.generation(), req.window_id())) {
    answer.ready = true;
    *answer.response.mutable_decision() = *d;
    return answer;
  }
  RETURN_IF_ERROR(CheckRunnable());
  RETURN_IF_ERROR(CheckMember(req.worker_id(), req.generation(), req.rank()));
  if (req.window_id() != last_window_ + 1) {
    return absl::FailedPreconditionError(
        absl::StrCat("window ", req.window_id(), " cannot complete: the window in progress is ",
                     last_window_ + 1));
  }
  ASSIGN_OR_RETURN(Attempt * attempt, AttemptFor(req.window_id()));
  RETURN_IF_ERROR(CheckBeginBarrierPassed(*attempt, req));
  const int32_t run = std::max(1, req.run());
  if (run < attempt->run) {
    // A first run's report, repeated or late, after the re-run was asked: ask again.
    answer.ready = true;
    answer.response.set_rerun(attempt->run);
    return answer;
  }
  if (run > attempt->run) {
    // A re-run this coordinator never asked for: the one that did restarted, and the first
    // run's reports (not journaled) are gone. Nothing was applied: the window is retried.
    if (!job_.spec().validate().rerun_on_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("run ", run, " of window ", req.window_id(), " was never asked for"));
    }
    // The restarted coordinator may have heard nothing else of the window (ranks stop sending
    // their begin reports once their all-reduce ran): this report is the window in flight, so
    // the abort is recorded and ends the generation.
    if (!attempt->has_any_report()) attempt->first_report = now;
    RETURN_IF_ERROR(RecordUnits(attempt, req.rank(), req.valid_units()));
    AbortInFlight(v1::WINDOW_REASON_RERUN_INTERRUPTED, now);
    MaybeFormGeneration(now);
    const v1::WindowDecision* d = FindDecision(req.generation(), req.window_id());
    if (d == nullptr) return absl::AbortedError("the window was aborted: rejoin");
    answer.ready = true;
    *answer.response.mutable_decision() = *d;
    return answer;
  }
  if (!attempt->has_any_report()) attempt->first_report = now;
  // The report carries n_r, so it also stands for a BeginWindow report that a restarted
  // coordinator never saw. Idempotent per rank: it never counts twice.
  RETURN_IF_ERROR(RecordUnits(attempt, req.rank(), req.valid_units()));
  membership_.NoteApplied(req.worker_id(), update_id_);
  // The report itself, without the begin report riding on it: sent again with or without
  // that, it is the same report.
  v1::CompleteWindowRequest report = req;
  report.clear_next();
  std::optional<v1::CompleteWindowRequest>& slot = attempt->complete[req.rank()];
  if (slot.has_value()) {
    if (ComparableBytes(*slot) != ComparableBytes(report)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rank ", req.rank(), " sent two different reports for window ", req.window_id()));
    }
  } else {
    slot = std::move(report);
    ++attempt->completes_reported;  // the decision's record wakes the waiters
  }
  // The next window's begin report counts before this window can be decided, as a BeginWindow
  // sent ahead does: so it does not claim that this rank applied the decision (NoteApplied),
  // which it learns only from this call's answer. Refused, it is only not answered here.
  if (req.has_next()) (void)BeginWindow(req.next(), now);
  const bool all = attempt->completes_reported == static_cast<int32_t>(attempt->complete.size());
  if (!all || !BarrierReady(*attempt)) return answer;
  DecideWindow(*attempt, now);
  answer.ready = true;
  const v1::WindowDecision* d = FindDecision(req.generation(), req.window_id());
  if (d == nullptr) {  // not decided: every rank computes it again first
    answer.response.set_rerun(attempt->run);
    return answer;
  }
  *answer.response.mutable_decision() = *d;
  return answer;
}

}  // namespace trainstep
