// The job as the client sees it: the Job message, its progress and rates, the workers.
// Part of StepMachine (coordinator/step_machine.h): one concept per file.

#include <algorithm>

#include "absl/strings/str_format.h"
#include "coordinator/lr_schedule.h"
#include "coordinator/step_machine.h"
#include "coordinator/throughput.h"
#include "core/spec.h"
#include "core/window_outcome.h"

namespace trainstep {

int64_t StepMachine::TotalWindows() const {
  return JobTotalWindows(job_.spec(), windows_per_epoch_);
}

int64_t StepMachine::EpochOf(int64_t window_id) const {
  return planner_ == nullptr ? 0 : planner_->EpochOf(window_id);
}

bool StepMachine::StopReachedAfter(int64_t window_id, int64_t update_id) const {
  const v1::Stop& stop = job_.spec().stop();
  if (stop.has_max_updates() && update_id >= stop.max_updates()) return true;
  const int64_t total = TotalWindows();
  return total > 0 && window_id >= total;
}

v1::Job StepMachine::Job() const {
  v1::Job job = job_;
  // Derived from this machine's state alone: a restored job_ still carries its snapshot's
  // progress, whose conditional fields (waiting, workers_available) must not outlive it.
  v1::JobProgress* p = job.mutable_progress();
  p->Clear();
  p->set_window_id(last_window_);
  p->set_optimizer_update_id(update_id_);
  p->set_scheduler_step(scheduler_step_);
  p->set_checkpoint_id(checkpoint_id_);
  const v1::CheckpointRecord* durable = LatestDurableCheckpoint();
  p->set_durable_checkpoint_id(durable == nullptr ? -1 : durable->checkpoint_id());
  p->set_cumulative_tokens(cumulative_tokens_);
  p->set_loss_scale(scaler_.scale());
  p->set_learning_rate(LearningRate(job_.spec(), scheduler_step_));
  p->set_generation(membership_.generation());
  p->set_world_size(membership_.world_size());
  p->set_windows_committed(counts_.committed);
  p->set_windows_skipped(counts_.skipped);
  p->set_windows_aborted(counts_.aborted);
  p->set_reruns(counts_.reruns);
  p->set_reruns_transient(counts_.reruns_transient);
  p->set_last_loss(counts_.last_loss);
  p->set_epoch(EpochOf(last_window_ + 1));
  p->set_micro_step_id(micro_step_id_);
  p->set_rollbacks(rollbacks_);
  if (const v1::Goodput g = goodput_.Report(); g.wall_seconds() > 0 || counts_.committed > 0) {
    *p->mutable_goodput() = g;
  }
  p->set_hangs(hangs_);
  p->set_checkpoint_failures(checkpoint_failures_);
  p->set_last_checkpoint_failure(last_checkpoint_failure_);
  p->set_last_hang(last_hang_);
  if (!terminal()) p->set_hang_deadline_ms(absl::ToInt64Milliseconds(ShortStepDeadlineNow()));
  if (!terminal() && dataset_.has_value() && !membership_.generation_live()) {
    // Visible, not silent: a job short of workers says what it waits for.
    const v1::Workers& w = job_.spec().workers();
    const int64_t available =
        static_cast<int64_t>(membership_.Survivors().size() + membership_.Standbys().size());
    p->set_workers_available(static_cast<int32_t>(available));
    if (available < w.min()) {
      p->set_waiting(
          absl::StrFormat("waiting for workers: %d available, workers.min is %d (workers.count %d)",
                          available, w.min(), w.count()));
    } else if (const int64_t dropped = DetachedSurvivors();
               available < w.count() && membership_.has_generation() && dropped > 0) {
      p->set_waiting(absl::StrFormat(
          "waiting for %d worker(s) whose connection dropped: each comes back or is lost when "
          "its lease ends (workers.count %d, %d available)",
          dropped, w.count(), available));
    } else if (available < w.count() && short_since_.has_value()) {
      p->set_waiting(absl::StrFormat(
          "waiting for %d more worker(s) until %s (workers.join_grace %s), then going on with %d",
          w.count() - available,
          absl::FormatTime(absl::RFC3339_sec, *short_since_ + JoinGrace(), absl::UTCTimeZone()),
          absl::FormatDuration(JoinGrace()), available));
    }
  }
  if (planner_ != nullptr) p->set_dropped_samples(p->epoch() * planner_->dropped_per_epoch());
  if (last_dropped_tail_.has_value()) *p->mutable_last_dropped_tail() = *last_dropped_tail_;
  if (job_.spec().stop().has_max_updates()) p->set_max_updates(job_.spec().stop().max_updates());
  p->set_windows_per_epoch(windows_per_epoch_);
  if (dataset_.has_value()) p->set_dataset_samples(dataset_->samples());
  if (last_eval_.has_value()) {
    p->set_last_eval_loss(last_eval_->eval_loss());
    p->set_last_eval_update_id(last_eval_->optimizer_update_id());
  }
  if (membership_.has_generation()) {
    // The latest generation's, also once it ended: which rank was slow stays visible.
    const auto& ranks = membership_.current().worker_ids();
    for (int rank = 0; rank < ranks.size(); ++rank) {
      std::optional<v1::RankScore> score = scores_.Find(ranks[rank]);
      if (!score.has_value()) continue;
      score->set_rank(rank);
      *p->add_rank_scores() = std::move(*score);
    }
  }
  return job;
}

size_t StepMachine::WatchableUpdates() const {
  if (!eval_due_.has_value() || terminal()) return updates_.size();
  // The commit being evaluated is the newest one (no window commits before its evaluation is
  // recorded); an abort of the next window may follow it, and waits too: the stream keeps
  // the log's order.
  for (size_t i = updates_.size(); i-- > 0;) {
    if (OutcomeOf(updates_[i]) != v1::COMMIT) continue;
    return updates_[i].optimizer_update_id() == *eval_due_ ? i : updates_.size();
  }
  return updates_.size();
}

v1::Throughput StepMachine::Throughput(absl::Time now) const {
  return ComputeThroughput(updates_, Job(), now);
}

std::vector<v1::WorkerInfo> StepMachine::Workers() const {
  std::vector<v1::WorkerInfo> out;
  for (const std::string& id : membership_.order()) {
    const WorkerEntry* w = membership_.Find(id);
    out.push_back(w->info);
    if (out.back().state() == v1::LOST) continue;
    if (w->phase != v1::COMPUTE_PHASE_UNSPECIFIED) {
      out.back().set_phase(w->phase);
      out.back().set_phase_ms(absl::ToInt64Milliseconds(
          std::max(absl::ZeroDuration(), w->phase_heard - w->phase_since)));
    }
    if (std::optional<v1::RankScore> score = scores_.Find(id)) *out.back().mutable_score() = *score;
  }
  return out;
}

}  // namespace trainstep
