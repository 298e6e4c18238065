// Evaluation barriers, checkpoint acknowledgements, and the end of a job that reached its stop.
// Part of StepMachine (coordinator/step_machine.h): one concept per file.

#include <limits>

#include "absl/strings/str_cat.h"
#include "common/proto_bytes.h"
#include "common/status_macros.h"
#include "coordinator/report_validation.h"
#include "coordinator/step_machine.h"

namespace trainstep {

const v1::CheckpointRecord* StepMachine::LatestDurableCheckpoint() const {
  for (auto it = checkpoints_.rbegin(); it != checkpoints_.rend(); ++it) {
    if (it->second.durable() && !it->second.damaged()) return &it->second;
  }
  return nullptr;
}

absl::Status StepMachine::CheckpointDamaged(const v1::ReportFailureRequest& req, absl::Time now) {
  const int64_t id = req.damaged_checkpoint_id();
  const v1::Assignment& a = membership_.current().assignment();
  if (!membership_.generation_live() || membership_.RankOf(req.worker_id()) < 0 ||
      a.state_source() != v1::Assignment::CHECKPOINT || a.checkpoint_id() != id) {
    // Another rank's report ended the generation first, or the worker is behind: it rejoins,
    // and a generation that loads the checkpoint again hears of it again.
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint ", id, " is not what a live generation of job ", job_id(),
                     " with worker ", req.worker_id(), " as a rank loads"));
  }
  AbortInFlight(v1::WINDOW_REASON_WORKER_LOST, now);
  v1::JournalRecord record;
  v1::GenerationEnded* ended = record.mutable_generation_ended();
  ended->set_job_id(job_id());
  ended->set_generation(membership_.generation());
  ended->set_reason(absl::StrCat("checkpoint ", id, " is damaged: ", req.message()));
  ended->set_worker_id(req.worker_id());
  ended->set_damaged_checkpoint_id(id);
  Emit(std::move(record), now);
  return absl::OkStatus();
}

std::optional<int64_t> StepMachine::PendingCheckpointFor(int64_t update_id) const {
  if (!CheckpointingEnabled()) return std::nullopt;
  for (auto it = checkpoints_.rbegin(); it != checkpoints_.rend(); ++it) {
    if (it->second.optimizer_update_id() == update_id) {
      if (it->second.durable()) return std::nullopt;
      return it->first;
    }
  }
  return std::nullopt;
}

absl::Status StepMachine::AckCheckpoint(const v1::AckCheckpointRequest& req, absl::Time now) {
  RETURN_IF_ERROR(ValidateAckCheckpoint(req));
  RETURN_IF_ERROR(FindRegistered(req.worker_id()).status());
  if (!CheckpointingEnabled()) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_id(), " has no checkpoint.dir: checkpoints are off"));
  }
  auto it = checkpoints_.find(req.checkpoint_id());
  if (it == checkpoints_.end()) {
    return absl::NotFoundError(
        absl::StrCat("checkpoint ", req.checkpoint_id(), " was never requested"));
  }
  if (it->second.optimizer_update_id() != req.optimizer_update_id()) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint ", req.checkpoint_id(), " holds optimizer update ",
                     it->second.optimizer_update_id(), ", not ", req.optimizer_update_id()));
  }
  if (it->second.durable()) return absl::OkStatus();
  if (!req.error().empty()) {
    // Not durable: counted and shown, nothing journaled. The previous durable checkpoint
    // stays the one a rollback uses; a final checkpoint is written again by rank 0.
    ++checkpoint_failures_;
    last_checkpoint_failure_ =
        absl::StrCat("checkpoint ", req.checkpoint_id(), " (update ", req.optimizer_update_id(),
                     ") on worker ", req.worker_id(), ": ", req.error());
    return absl::OkStatus();
  }
  v1::JournalRecord record;
  v1::CheckpointDurable* c = record.mutable_checkpoint_durable();
  c->set_job_id(job_id());
  c->set_checkpoint_id(req.checkpoint_id());
  c->set_path(req.path());
  Emit(std::move(record), now);
  MaybeFinish(now);
  return absl::OkStatus();
}

absl::StatusOr<Answer<v1::ReportEvalResponse>> StepMachine::ReportEval(
    const v1::ReportEvalRequest& req, absl::Time now) {
  RETURN_IF_ERROR(ValidateReportEval(req));
  Answer<v1::ReportEvalResponse> answer;
  if (last_eval_.has_value() && last_eval_->optimizer_update_id() == req.optimizer_update_id() &&
      eval_due_ != req.optimizer_update_id()) {
    answer.ready = true;  // recorded: a repeat, or a rank that learns the result late
    answer.response.set_eval_loss(last_eval_->eval_loss());
    answer.response.set_valid_units(last_eval_->valid_units());
    return answer;
  }
  RETURN_IF_ERROR(CheckRunnable());
  RETURN_IF_ERROR(CheckMember(req.worker_id(), req.generation(), req.rank()));
  if (eval_due_ != req.optimizer_update_id()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no evaluation of update ", req.optimizer_update_id(), " is due",
        eval_due_.has_value() ? absl::StrCat(" (update ", *eval_due_, "'s is)") : std::string(),
        ": a rank evaluates only when a decision (run_eval) or its assignment asks"));
  }
  if (!eval_attempt_.has_value() || eval_attempt_->generation != req.generation()) {
    // Built, then moved in: clang 14 rejects emplace() of a nested struct with default member
    // initializers (is_constructible is evaluated as if the enclosing class were incomplete).
    EvalAttempt attempt;
    attempt.generation = req.generation();
    attempt.reports.resize(membership_.world_size());
    eval_attempt_ = std::move(attempt);
  }
  std::optional<v1::ReportEvalRequest>& slot = eval_attempt_->reports[req.rank()];
  if (slot.has_value()) {
    if (ComparableBytes(*slot) != ComparableBytes(req)) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", req.rank(),
                                                     " sent two different evaluations of update ",
                                                     req.optimizer_update_id()));
    }
  } else {
    slot = req;
    ++eval_attempt_->reported;  // a partial count wakes nobody; the record wakes everyone
  }
  if (eval_attempt_->reported != static_cast<int32_t>(eval_attempt_->reports.size())) {
    return answer;
  }
  // Token-weighted over every rank's share: Σ loss_sum_r / Σ n_r, never a mean of means.
  double loss_sum = 0.0;
  int64_t units = 0;
  for (const std::optional<v1::ReportEvalRequest>& r : eval_attempt_->reports) {
    loss_sum += r->loss_sum();
    units += r->valid_units();
  }
  v1::JournalRecord record;
  v1::EvalEnded* e = record.mutable_eval_ended();
  e->set_job_id(job_id());
  e->set_generation(req.generation());
  e->set_optimizer_update_id(req.optimizer_update_id());
  e->set_eval_loss(units > 0 ? loss_sum / static_cast<double>(units)
                             : std::numeric_limits<double>::quiet_NaN());
  e->set_valid_units(units);
  answer.ready = true;
  answer.response.set_eval_loss(e->eval_loss());
  answer.response.set_valid_units(units);
  Emit(std::move(record), now);
  MaybeFinish(now);
  MaybeEndEmptyWindow(now);
  return answer;
}

void StepMachine::MaybeFinish(absl::Time now) {
  if (terminal() || !StopReachedAfter(last_window_, update_id_)) return;
  if (eval_due_.has_value()) return;                         // wait for the final evaluation
  if (PendingCheckpointFor(update_id_).has_value()) return;  // wait for the final checkpoint
  v1::JournalRecord record;
  v1::JobEnded* e = record.mutable_job_ended();
  e->set_job_id(job_id());
  e->set_state(v1::SUCCEEDED);
  Emit(std::move(record), now);
}

}  // namespace trainstep
