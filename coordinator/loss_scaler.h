// The job's one loss-scale state machine (docs/numerics.md, rules 9 and 11). PyTorch
// GradScaler's rule, computed in float32 exactly as `_amp_update_scale_` does, plus DeepSpeed's
// optional hysteresis and a floor. Updated once per window by the step machine, never per
// micro-batch.
#ifndef TRAINSTEP_COORDINATOR_LOSS_SCALER_H_
#define TRAINSTEP_COORDINATOR_LOSS_SCALER_H_

#include <cstdint>

#include "core/spec.h"
#include "trainstep/v1/journal.pb.h"
#include "trainstep/v1/spec.pb.h"

namespace trainstep {

// Defaults to the spec's (core/spec.h DefaultLossScaler), disabled.
struct LossScalerConfig {
  bool enabled = false;
  double init_scale = DefaultLossScaler().init_scale();
  double growth_factor = DefaultLossScaler().growth_factor();
  double backoff_factor = DefaultLossScaler().backoff_factor();
  int64_t growth_interval = DefaultLossScaler().growth_interval();
  // Overflows tolerated before backing off (1 = back off at once).
  int32_t hysteresis = DefaultLossScaler().hysteresis();
  // Backoff never goes below this (0 = no floor, as PyTorch).
  double min_scale = DefaultLossScaler().min_scale();

  static LossScalerConfig FromSpec(const v1::LossScaler& spec);
};

// Value type; not thread-safe.
class LossScaler {
 public:
  explicit LossScaler(const LossScalerConfig& config);
  LossScaler(const LossScalerConfig& config, const v1::ScalerState& state);

  // The S that multiplies the loss in the window now starting (1 when disabled).
  double scale() const { return config_.enabled ? static_cast<double>(scale_) : 1.0; }
  int64_t growth_tracker() const { return growth_tracker_; }
  bool enabled() const { return config_.enabled; }

  // The once-per-window update. found_inf: any rank saw a non-finite unscaled gradient.
  void Update(bool found_inf);

  v1::ScalerState State() const;

 private:
  LossScalerConfig config_;
  float scale_;  // float32, like GradScaler's scale tensor: growth must not overflow it
  int64_t growth_tracker_ = 0;
  int32_t hysteresis_left_;
};

}  // namespace trainstep

#endif  // TRAINSTEP_COORDINATOR_LOSS_SCALER_H_
