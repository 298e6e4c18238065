#include "coordinator/loss_scaler.h"

#include <algorithm>
#include <cmath>

namespace trainstep {

LossScalerConfig LossScalerConfig::FromSpec(const v1::LossScaler& spec) {
  LossScalerConfig c;
  c.enabled = spec.enabled();
  if (spec.has_init_scale()) c.init_scale = spec.init_scale();
  if (spec.has_growth_factor()) c.growth_factor = spec.growth_factor();
  if (spec.has_backoff_factor()) c.backoff_factor = spec.backoff_factor();
  if (spec.has_growth_interval()) c.growth_interval = spec.growth_interval();
  if (spec.has_hysteresis()) c.hysteresis = spec.hysteresis();
  if (spec.has_min_scale()) c.min_scale = spec.min_scale();
  return c;
}

LossScaler::LossScaler(const LossScalerConfig& config)
    : config_(config),
      scale_(static_cast<float>(config.init_scale)),
      hysteresis_left_(config.hysteresis) {}

LossScaler::LossScaler(const LossScalerConfig& config, const v1::ScalerState& state)
    : config_(config),
      scale_(static_cast<float>(state.scale())),
      growth_tracker_(state.growth_tracker()),
      hysteresis_left_(state.hysteresis_left()) {}

void LossScaler::Update(bool found_inf) {
  if (!config_.enabled) return;
  if (found_inf) {
    growth_tracker_ = 0;
    // DeepSpeed's hysteresis: tolerate a few overflows before backing off.
    if (hysteresis_left_ > 1) {
      --hysteresis_left_;
      return;
    }
    float backed_off = scale_ * static_cast<float>(config_.backoff_factor);
    scale_ = std::max(backed_off, static_cast<float>(config_.min_scale));
    return;
  }
  const int64_t successful = growth_tracker_ + 1;
  if (successful == config_.growth_interval) {
    // GradScaler computes the grown scale in float32 and keeps the old one if it overflows.
    const float grown = scale_ * static_cast<float>(config_.growth_factor);
    if (std::isfinite(grown)) scale_ = grown;
    growth_tracker_ = 0;
    hysteresis_left_ = config_.hysteresis;
  } else {
    growth_tracker_ = successful;
  }
}

v1::ScalerState LossScaler::State() const {
  v1::ScalerState s;
  s.set_scale(scale_);
  s.set_growth_tracker(growth_tracker_);
  s.set_hysteresis_left(hysteresis_left_);
  return s;
}

}  // namespace trainstep
