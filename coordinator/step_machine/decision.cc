// The decision of a window (COMMIT, SKIP or ABORT) and how a window ends.
// Part of StepMachine (coordinator/step_machine.h): one concept per file.

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "coordinator/lr_schedule.h"
#include "coordinator/report_validation.h"
#include "coordinator/step_machine.h"
#include "core/window_outcome.h"

namespace trainstep {

namespace {

constexpr double kClipEpsilon = 1e-6;
constexpr double kNormRelativeTolerance = 1e-6;

}  // namespace

double ClipCoefficient(std::optional<double> max_grad_norm, double grad_norm) {
  if (!max_grad_norm.has_value()) return 1.0;
  return std::min(1.0, *max_grad_norm / (grad_norm + kClipEpsilon));
}

bool GradNormsAgree(double a, double b) {
  if (a == b) return true;
  if (!std::isfinite(a) || !std::isfinite(b)) return false;  // inf tolerance would accept anything
  return std::fabs(a - b) <= kNormRelativeTolerance * std::max(std::fabs(a), std::fabs(b));
}

v1::UpdateRecord StepMachine::BaseRecord(int64_t window_id) const {
  v1::UpdateRecord r;
  r.set_window_id(window_id);
  r.set_generation(membership_.generation());
  r.set_world_size(membership_.world_size());
  r.set_optimizer_update_id(update_id_);
  r.set_scheduler_step(scheduler_step_);
  r.set_cumulative_tokens(cumulative_tokens_);
  r.set_learning_rate(LearningRate(job_.spec(), scheduler_step_));
  r.set_loss_scale(scaler_.scale());
  r.set_checkpoint_id(checkpoint_id_);
  r.set_epoch(EpochOf(window_id));
  r.set_micro_step_id(micro_step_id_);
  r.set_tail_window(planner_ != nullptr && planner_->IsTailWindow(window_id));
  return r;
}

void StepMachine::DecideWindow(Attempt& attempt, absl::Time now) {
  const size_t world = attempt.complete.size();
  const v1::CompleteWindowRequest& first = *attempt.complete[0];
  const auto observe_speed = [&] {
    // Every rank reported the window: how fast each computed its share (straggler scores).
    std::vector<RankScores::Sample> samples(world);
    for (size_t rank = 0; rank < world; ++rank) {
      const v1::CompleteWindowRequest& c = *attempt.complete[rank];
      samples[rank] = {c.worker_id(), c.has_phases() ? c.valid_units() : 0, c.phases()};
    }
    scores_.Observe(samples);
  };
  int64_t units = 0, micro_steps = 0;
  double loss_sum = 0.0;
  size_t inf_ranks = 0;
  std::string desync;
  for (size_t rank = 0; rank < world; ++rank) {
    const v1::CompleteWindowRequest& c = *attempt.complete[rank];
    units += c.valid_units();
    micro_steps += c.micro_steps();
    loss_sum += c.loss_sum();
    if (c.found_inf()) ++inf_ranks;
    if (desync.empty() && c.allreduce_calls() != first.allreduce_calls()) {
      desync = absl::StrCat("rank ", rank, " made ", c.allreduce_calls(),
                            " all-reduce calls, rank 0 made ", first.allreduce_calls());
    }
  }
  // Every rank checks the same all-reduced gradient, so they must agree on found_inf and
  // on its norm. Disagreement means the replicas diverged: never continue silently.
  if (desync.empty() && inf_ranks != 0 && inf_ranks != world) {
    desync = absl::StrCat(inf_ranks, " of ", world, " ranks found non-finite gradients");
  }
  if (desync.empty() && inf_ranks == 0) {
    for (size_t rank = 1; rank < world; ++rank) {
      const double norm = attempt.complete[rank]->grad_norm();
      if (!GradNormsAgree(norm, first.grad_norm())) {
        desync = absl::StrFormat("rank %d reports grad norm %.9g, rank 0 %.9g", rank, norm,
                                 first.grad_norm());
        break;
      }
    }
  }

  v1::WindowDecision d;
  v1::UpdateRecord* r = d.mutable_record();
  *r = BaseRecord(attempt.window_id);
  r->set_micro_steps(micro_steps);
  r->set_global_valid_tokens(units);
  r->set_allreduce_calls(first.allreduce_calls());
  r->set_loss(units > 0 ? loss_sum / static_cast<double>(units) : 0.0);
  r->set_grad_norm_pre_clip(first.grad_norm());
  if (first.has_grad_norm_scaled()) r->set_grad_norm_scaled(first.grad_norm_scaled());
  r->set_window_seconds(absl::ToDoubleSeconds(now - attempt.first_report));

  if (!desync.empty()) {
    d.set_outcome(v1::ABORT);
    SetReason(&d, v1::WINDOW_REASON_DESYNC);
    r->set_grad_norm_post_clip(0.0);
    observe_speed();
    EndWindow(std::move(d), now);
    if (terminal()) return;
    if (consecutive_desyncs_ >= options_.max_consecutive_desyncs) {
      FailJob(absl::StrCat("replicas diverged ", consecutive_desyncs_, " times in a row at window ",
                           last_window_ + 1, " (", desync, ")"),  // `attempt` died in Apply
              now);
      return;
    }
    MaybeFormGeneration(now);
    return;
  }
  if (units == 0) {
    // Normally decided at the begin barrier; reached here only when the coordinator
    // restarted between the barrier and the reports.
    d.set_outcome(v1::SKIP);
    SetReason(&d, v1::WINDOW_REASON_EMPTY_WINDOW);
  } else if (inf_ranks > 0) {
    d.set_outcome(v1::SKIP);
    SetReason(&d, v1::WINDOW_REASON_OVERFLOW);
  } else if (!std::isfinite(loss_sum) || !std::isfinite(first.grad_norm())) {
    d.set_outcome(v1::SKIP);
    SetReason(&d, v1::WINDOW_REASON_NONFINITE_LOSS);
  } else {
    d.set_outcome(v1::COMMIT);
  }
  if (attempt.run == 1) {
    if (std::optional<v1::RerunCause> cause = RerunCauseOf(d)) {
      AskRerun(attempt, *cause);
      return;
    }
  } else {
    AttributeRerun(attempt, &d);
  }
  observe_speed();
  EndWindow(std::move(d), now);
}

void StepMachine::EndWindow(v1::WindowDecision d, absl::Time now) {
  v1::UpdateRecord* r = d.mutable_record();
  SetOutcome(r, d.outcome());
  r->set_reason(d.reason());
  r->set_reason_code(d.reason_code());
  const v1::Clip& clip = job_.spec().clip();
  std::optional<double> max_norm;
  if (clip.has_max_grad_norm()) max_norm = clip.max_grad_norm();

  LossScaler scaler_after = scaler_;
  int64_t update_after = update_id_;
  int64_t step_after = scheduler_step_;
  if (d.outcome() == v1::COMMIT) {
    const double coef = ClipCoefficient(max_norm, r->grad_norm_pre_clip());
    d.set_clip_coef(coef);
    r->set_clip_coef(coef);
    r->set_grad_norm_post_clip(r->grad_norm_pre_clip() * coef);
    update_after = update_id_ + 1;
    step_after = scheduler_step_ + 1;
    r->set_cumulative_tokens(SaturatingAdd(cumulative_tokens_, r->global_valid_tokens()));
    scaler_after.Update(/*found_inf=*/false);
    // From the previous commit in the log, or from the job's start for the first one.
    const int64_t since_ms = last_commit_ms_ > 0 ? last_commit_ms_ : job_.start_time_ms();
    r->set_update_interval_seconds(
        static_cast<double>(std::max<int64_t>(0, absl::ToUnixMillis(now) - since_ms)) / 1000.0);
  } else if (d.outcome() == v1::SKIP) {
    // The scaler reacts to gradient overflow only, once per window.
    if (d.reason_code() == v1::WINDOW_REASON_OVERFLOW) scaler_after.Update(/*found_inf=*/true);
    r->set_grad_norm_post_clip(0.0);
  }
  d.set_learning_rate(r->learning_rate());
  d.set_optimizer_update_id(update_after);
  d.set_scheduler_step(step_after);
  r->set_optimizer_update_id(update_after);
  r->set_scheduler_step(step_after);
  r->set_loss_scale(scaler_after.scale());
  r->set_end_time_ms(absl::ToUnixMillis(now));

  v1::JournalRecord record;
  v1::WindowEnded* ended = record.mutable_window_ended();
  ended->set_job_id(job_id());
  *ended->mutable_scaler_after() = scaler_after.State();

  if (d.outcome() != v1::ABORT) {
    // The window's micro-batches ran and it ended: they count (an abort's are run again).
    r->set_micro_step_id(SaturatingAdd(micro_step_id_, r->micro_steps()));
    if (planner_ != nullptr && planner_->EndsEpoch(r->window_id()) &&
        planner_->dropped_per_epoch() > 0) {
      *r->mutable_dropped_tail() = planner_->DroppedTail(EpochOf(r->window_id()));
    }
    const bool done = StopReachedAfter(r->window_id(), update_after);
    d.set_job_done(done);
    const int64_t every = job_.spec().checkpoint().every_updates();
    const bool periodic = d.outcome() == v1::COMMIT && every > 0 && update_after % every == 0;
    // The last committed update is always checkpointed when the job ends.
    const bool final_needed =
        done && checkpoints_.rbegin()->second.optimizer_update_id() != update_after;
    // Every eval.every_updates-th update, and the last one (once) when the job ends.
    const int64_t eval_every = job_.spec().eval().every_updates();  // 0 without eval
    const bool periodic_eval =
        d.outcome() == v1::COMMIT && eval_every > 0 && update_after % eval_every == 0;
    const bool final_eval =
        done && (!last_eval_.has_value() || last_eval_->optimizer_update_id() != update_after);
    d.set_run_eval(EvalEnabled() && update_after > 0 && (periodic_eval || final_eval));
    if (CheckpointingEnabled() && (periodic || final_needed)) {
      v1::CheckpointRecord* c = ended->mutable_checkpoint_assigned();
      c->set_checkpoint_id(next_checkpoint_id_);
      c->set_window_id(r->window_id());
      c->set_optimizer_update_id(update_after);
      c->set_scheduler_step(step_after);
      c->set_cumulative_tokens(r->cumulative_tokens());
      c->set_micro_step_id(r->micro_step_id());
      *c->mutable_scaler() = scaler_after.State();
      d.set_write_checkpoint(true);
      d.set_checkpoint_id(next_checkpoint_id_);
      r->set_checkpoint_id(next_checkpoint_id_);
    }
  }
  *ended->mutable_decision() = std::move(d);
  Emit(std::move(record), now);
  // Begin reports of the next window sent ahead (pipelined) arrived while this one was open:
  // the next window's time (window_seconds) starts now, not then.
  if (auto next = attempts_.find(last_window_ + 1);
      next != attempts_.end() && next->second.has_any_report()) {
    next->second.first_report = std::max(next->second.first_report, now);
  }
  MaybeFinish(now);
  MaybeEndEmptyWindow(now);
  // One change of members per boundary: the generation each forms runs a window first.
  if (!MaybeGrow(now) && !MaybeDrainSuspect(now)) MaybeReplaceStraggler(now);
}

void StepMachine::MaybeEndEmptyWindow(absl::Time now) {
  if (terminal() || StopReachedAfter(last_window_, update_id_)) return;  // no window after the stop
  auto it = attempts_.find(last_window_ + 1);
  if (it == attempts_.end() || !BarrierReady(it->second)) return;
  if (it->second.total_units != 0) return;
  if (FindDecision(membership_.generation(), it->first) != nullptr) return;
  v1::WindowDecision d;
  d.set_outcome(v1::SKIP);
  SetReason(&d, v1::WINDOW_REASON_EMPTY_WINDOW);
  v1::UpdateRecord* r = d.mutable_record();
  *r = BaseRecord(it->first);
  r->set_window_seconds(absl::ToDoubleSeconds(now - it->second.first_report));
  EndWindow(std::move(d), now);
}

void StepMachine::AbortInFlight(v1::WindowReason reason, absl::Time now) {
  auto it = attempts_.find(last_window_ + 1);
  if (it == attempts_.end() || !it->second.has_any_report()) {
    // Nothing in flight: the generation still ends, without a log record.
    return;
  }
  v1::WindowDecision d;
  d.set_outcome(v1::ABORT);
  SetReason(&d, reason);
  v1::UpdateRecord* r = d.mutable_record();
  *r = BaseRecord(it->first);
  r->set_global_valid_tokens(it->second.total_units);
  r->set_window_seconds(absl::ToDoubleSeconds(now - it->second.first_report));
  EndWindow(std::move(d), now);
}

}  // namespace trainstep
