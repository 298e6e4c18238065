#include "client/progress.h"

#include <algorithm>

#include "core/spec.h"
#include "core/window_outcome.h"

namespace trainstep::client {

void ProgressTracker::OnJob(const v1::Job& job, absl::Time now) {
  const v1::JobProgress& p = job.progress();
  if (!has_job_) {
    has_job_ = true;
    start_ = now;
    base_tokens_ = tokens_ = p.cumulative_tokens();
    base_updates_ = updates_ = p.optimizer_update_id();
    base_windows_ = windows_ = p.window_id();
  }
  job_ = job;
  tokens_ = std::max(tokens_, p.cumulative_tokens());
  updates_ = std::max(updates_, p.optimizer_update_id());
  windows_ = std::max(windows_, p.window_id());
  if (p.has_last_eval_loss()) eval_loss_ = p.last_eval_loss();
  if (p.window_id() >= latest_window_) {
    latest_window_ = p.window_id();
    has_loss_ = p.optimizer_update_id() > 0;
    loss_ = p.last_loss();
    loss_scale_ = p.loss_scale();
    learning_rate_ = p.learning_rate();
  }
}

void ProgressTracker::OnUpdate(const v1::UpdateRecord& r, absl::Time now) {
  tokens_ = std::max(tokens_, r.cumulative_tokens());
  updates_ = std::max(updates_, r.optimizer_update_id());
  windows_ = std::max(windows_, r.window_id());
  if (r.has_eval_loss()) eval_loss_ = r.eval_loss();
  if (r.window_id() > latest_window_) {
    latest_window_ = r.window_id();
    // A skipped window's loss may be NaN or inf; the line keeps the last trained one.
    if (OutcomeOf(r) == v1::COMMIT) {
      has_loss_ = true;
      loss_ = r.loss();
    }
    loss_scale_ = r.loss_scale();
    learning_rate_ = r.learning_rate();
  }
}

ProgressView ProgressTracker::View(absl::Time now) const {
  ProgressView v;
  const v1::JobProgress& p = job_.progress();
  v.waiting = p.waiting();
  int64_t base_done = base_updates_;
  v.done = updates_;
  if (p.max_updates() > 0) {
    v.total = p.max_updates();
  } else if (MaxUpdates(job_) > 0) {
    // Bounded by epochs: the job ends after that many windows, skipped ones included.
    v.label = "window";
    v.done = windows_;
    v.total = MaxUpdates(job_);
    base_done = base_windows_;
  }
  v.unit = IsTokenLevel(job_.spec()) ? "tok" : "samples";
  const double elapsed = absl::ToDoubleSeconds(now - start_);
  const v1::Throughput& t = job_.throughput();
  if (t.span_seconds() > 0) {
    v.units_per_second = t.tokens_per_second();
    v.updates_per_second = t.updates_per_second();
    if (t.has_eta_seconds()) v.eta = absl::Seconds(t.eta_seconds());
  } else if (has_job_ && elapsed > 0 && (elapsed >= 1 || tokens_ > base_tokens_)) {
    v.units_per_second = static_cast<double>(tokens_ - base_tokens_) / elapsed;
    const double done_rate = static_cast<double>(v.done - base_done) / elapsed;
    if (v.total > 0 && done_rate > 0) {
      v.eta =
          absl::Seconds(static_cast<double>(std::max<int64_t>(0, v.total - v.done)) / done_rate);
    }
  }
  if (has_loss_) v.loss = loss_;
  v.eval_loss = eval_loss_;
  v.loss_scale = loss_scale_;
  v.learning_rate = learning_rate_;
  v.skipped = p.windows_skipped();
  return v;
}

}  // namespace trainstep::client
