#include "coordinator/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace trainstep {
namespace {

double WarmupDecayFactor(const v1::WarmupDecay& s, int64_t step, bool cosine) {
  const int64_t warmup = s.warmup_updates();
  if (step < warmup) return static_cast<double>(step + 1) / static_cast<double>(warmup);
  const int64_t decay_steps = s.total_updates() - warmup;
  double p = decay_steps <= 0 ? 1.0 : static_cast<double>(step - warmup) / decay_steps;
  p = std::clamp(p, 0.0, 1.0);
  const double m = s.min_lr_ratio();
  if (cosine) return m + (1.0 - m) * 0.5 * (1.0 + std::cos(M_PI * p));
  return m + (1.0 - m) * (1.0 - p);
}

}  // namespace

double LrFactor(const v1::Schedule& schedule, int64_t scheduler_step) {
  switch (schedule.kind_case()) {
    case v1::Schedule::kWarmupCosine:
      return WarmupDecayFactor(schedule.warmup_cosine(), scheduler_step, /*cosine=*/true);
    case v1::Schedule::kWarmupLinear:
      return WarmupDecayFactor(schedule.warmup_linear(), scheduler_step, /*cosine=*/false);
    case v1::Schedule::kConstant:
    case v1::Schedule::KIND_NOT_SET:
      return 1.0;
  }
  return 1.0;
}

double LearningRate(const v1::JobSpec& resolved, int64_t scheduler_step) {
  const v1::Optimizer& opt = resolved.optimizer();
  const double base = opt.has_sgd() ? opt.sgd().lr() : opt.adamw().lr();
  return base * LrFactor(resolved.schedule(), scheduler_step);
}

}  // namespace trainstep
