// Re-run on suspicion: which windows are computed again before their decision, and what two
// runs of a window say about a rank (validate.rerun_on).
// Part of StepMachine (coordinator/step_machine.h): one concept per file.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "coordinator/step_machine.h"
#include "core/window_outcome.h"

namespace trainstep {

namespace {

// The least σ a loss spike is measured in, relative to the mean loss (validate.spike_sigma).
constexpr double kSpikeSigmaFloor = 1e-6;

}  // namespace

std::optional<v1::RerunCause> StepMachine::RerunCauseOf(const v1::WindowDecision& d) const {
  const v1::Validate& v = job_.spec().validate();
  const auto on = [&v](v1::Validate::Trigger t) {
    return std::find(v.rerun_on().begin(), v.rerun_on().end(), t) != v.rerun_on().end();
  };
  // Non-finite gradients are an overflow the scaler expects only with a scaler.
  const bool nonfinite = d.reason_code() == v1::WINDOW_REASON_NONFINITE_LOSS ||
                         (d.reason_code() == v1::WINDOW_REASON_OVERFLOW && !scaler_config_.enabled);
  if (nonfinite && on(v1::Validate::nonfinite)) return v1::RERUN_CAUSE_NONFINITE;
  if (d.outcome() == v1::COMMIT && on(v1::Validate::spike) && IsSpike(d.record().loss())) {
    return v1::RERUN_CAUSE_SPIKE;
  }
  return std::nullopt;
}

bool StepMachine::IsSpike(double loss) const {
  const v1::Validate& v = job_.spec().validate();
  const size_t n = static_cast<size_t>(v.spike_window());
  std::vector<double> losses;
  losses.reserve(n);
  for (auto it = updates_.rbegin(); it != updates_.rend() && losses.size() < n; ++it) {
    if (OutcomeOf(*it) == v1::COMMIT) losses.push_back(it->loss());
  }
  if (losses.size() < n) return false;
  double sum = 0.0;
  for (const double x : losses) sum += x;
  const double mean = sum / static_cast<double>(n);
  double squares = 0.0;  // about the mean: E[x²] − mean² cancels to noise for close losses
  for (const double x : losses) squares += (x - mean) * (x - mean);
  // Losses equal to their last digits have σ ≈ 0; a rise in those digits is no spike.
  const double sigma =
      std::max(std::sqrt(squares / static_cast<double>(n)), kSpikeSigmaFloor * std::abs(mean));
  return loss > mean + v.spike_sigma() * sigma;
}

void StepMachine::AskRerun(Attempt& attempt, v1::RerunCause cause) {
  attempt.first_run = std::move(attempt.complete);
  attempt.complete.assign(attempt.first_run.size(), std::nullopt);
  attempt.completes_reported = 0;
  attempt.run = 2;
  attempt.rerun_cause = cause;
  ++version_;  // the ranks waiting for the decision are answered: compute the window again
}

namespace {

// Bit for bit, except that any NaN equals any NaN (its payload says nothing of the data).
bool SameBits(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  uint64_t x, y;
  std::memcpy(&x, &a, sizeof x);
  std::memcpy(&y, &b, sizeof y);
  return x == y;
}

// Whether a rank's second run reproduced its first: its loss, units and local gradient.
bool Reproduced(const v1::CompleteWindowRequest& first, const v1::CompleteWindowRequest& again) {
  return SameBits(first.loss_sum(), again.loss_sum()) &&
         first.valid_units() == again.valid_units() &&
         first.has_grad_checksum() == again.has_grad_checksum() &&
         first.grad_checksum() == again.grad_checksum();
}

// How much a rank's share weighs in a bad window: a non-finite loss above any finite one.
double LossWeight(const v1::CompleteWindowRequest& c) {
  if (!std::isfinite(c.loss_sum())) return std::numeric_limits<double>::infinity();
  return c.valid_units() > 0 ? c.loss_sum() / static_cast<double>(c.valid_units()) : 0.0;
}

}  // namespace

void StepMachine::AttributeRerun(const Attempt& attempt, v1::WindowDecision* d) const {
  v1::Rerun* rerun = d->mutable_record()->mutable_rerun();
  SetCause(rerun, attempt.rerun_cause);
  for (size_t rank = 0; rank < attempt.complete.size(); ++rank) {
    if (!Reproduced(*attempt.first_run[rank], *attempt.complete[rank])) {
      rerun->add_ranks(static_cast<int32_t>(rank));
      rerun->add_worker_ids(attempt.complete[rank]->worker_id());
    }
  }
  if (rerun->ranks_size() > 0) {
    // Its first run is discarded: the window is decided on the second, as a retry.
    SetVerdict(rerun, v1::RERUN_VERDICT_TRANSIENT);
    rerun->set_rank(rerun->ranks(0));
    rerun->set_worker_id(rerun->worker_ids(0));
    return;
  }
  SetVerdict(rerun, v1::RERUN_VERDICT_PERSISTENT);
  size_t worst = 0;
  for (size_t rank = 1; rank < attempt.complete.size(); ++rank) {
    if (LossWeight(*attempt.complete[rank]) > LossWeight(*attempt.complete[worst])) worst = rank;
  }
  const v1::CompleteWindowRequest& c = *attempt.complete[worst];
  rerun->set_rank(static_cast<int32_t>(worst));
  rerun->set_worker_id(c.worker_id());
  // Its samples whose loss dominates: the non-finite ones and those within half the worst.
  for (const v1::SampleLoss& s : c.sample_losses()) {
    const double top = c.sample_losses(0).loss();  // the worst: reported first
    if (!std::isfinite(s.loss()) || (std::isfinite(top) && s.loss() >= 0.5 * top)) {
      rerun->add_sample_ids(s.sample_id());
    }
  }
  if (attempt.rerun_cause == v1::RERUN_CAUSE_SPIKE && job_.spec().validate().skip_spikes() &&
      d->outcome() == v1::COMMIT) {
    d->set_outcome(v1::SKIP);
    SetReason(d, v1::WINDOW_REASON_LOSS_SPIKE);
  }
}

}  // namespace trainstep
