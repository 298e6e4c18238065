#include "coordinator/loss_scaler.h"

#include <cfloat>
#include <cmath>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace trainstep {
namespace {

LossScalerConfig Enabled(double init, double growth, double backoff, int64_t interval) {
  LossScalerConfig c;
  c.enabled = true;
  c.init_scale = init;
  c.growth_factor = growth;
  c.backoff_factor = backoff;
  c.growth_interval = interval;
  return c;
}

// Catches: any deviation from GradScaler's _amp_update_scale_ on the brief's example
// (growth at the interval, tracker reset, backoff on overflow).
TEST(LossScalerTest, BriefExampleFollowsGradScalerRule) {
  LossScaler s(Enabled(4, 2, 0.25, 2));
  ASSERT_EQ(s.scale(), 4.0);
  ASSERT_EQ(s.growth_tracker(), 0);
  const std::vector<std::pair<bool, std::pair<double, int64_t>>> steps = {
      {false, {4.0, 1}}, {false, {8.0, 0}}, {true, {2.0, 0}}};
  for (const auto& [found_inf, expected] : steps) {
    s.Update(found_inf);
    EXPECT_EQ(s.scale(), expected.first);
    EXPECT_EQ(s.growth_tracker(), expected.second);
  }
}

// Catches: defaults drifting from PyTorch's GradScaler (65536, 2.0, 0.5, 2000) or hysteresis
// on by default (it would delay the first backoff).
TEST(LossScalerTest, DefaultsArePyTorchs) {
  LossScalerConfig c;
  EXPECT_EQ(c.init_scale, 65536.0);
  EXPECT_EQ(c.growth_factor, 2.0);
  EXPECT_EQ(c.backoff_factor, 0.5);
  EXPECT_EQ(c.growth_interval, 2000);
  EXPECT_EQ(c.hysteresis, 1);
  EXPECT_EQ(c.min_scale, 0.0);

  v1::LossScaler spec;
  spec.set_enabled(true);
  LossScalerConfig from_spec = LossScalerConfig::FromSpec(spec);
  EXPECT_TRUE(from_spec.enabled);
  EXPECT_EQ(from_spec.init_scale, 65536.0);
  EXPECT_EQ(from_spec.growth_interval, 2000);

  LossScaler s(from_spec);
  for (int i = 0; i < 1999; ++i) s.Update(false);
  EXPECT_EQ(s.scale(), 65536.0);  // growth exactly at the 2000th good window, not before
  s.Update(false);
  EXPECT_EQ(s.scale(), 131072.0);
  s.Update(true);
  EXPECT_EQ(s.scale(), 65536.0);
}

// Catches: FromSpec ignoring an explicitly set field.
TEST(LossScalerTest, FromSpecReadsEveryField) {
  v1::LossScaler spec;
  spec.set_enabled(true);
  spec.set_init_scale(1024);
  spec.set_growth_factor(4);
  spec.set_backoff_factor(0.25);
  spec.set_growth_interval(10);
  spec.set_hysteresis(3);
  spec.set_min_scale(2);
  LossScalerConfig c = LossScalerConfig::FromSpec(spec);
  EXPECT_EQ(c.init_scale, 1024);
  EXPECT_EQ(c.growth_factor, 4);
  EXPECT_EQ(c.backoff_factor, 0.25);
  EXPECT_EQ(c.growth_interval, 10);
  EXPECT_EQ(c.hysteresis, 3);
  EXPECT_EQ(c.min_scale, 2);
}

// Catches: growth computed in double (or unguarded) so a scale near FLT_MAX becomes inf in
// GradScaler's float32 scale tensor.
TEST(LossScalerTest, GrowthNeverOverflowsFloat32) {
  LossScaler s(Enabled(static_cast<double>(FLT_MAX) / 1.5, 2, 0.5, 1));
  const double before = s.scale();
  s.Update(false);
  EXPECT_TRUE(std::isfinite(s.scale()));
  EXPECT_EQ(s.scale(), before);  // GradScaler keeps the old scale when growth overflows
  EXPECT_EQ(s.growth_tracker(), 0);
  EXPECT_TRUE(std::isfinite(s.State().scale()));
}

// Catches: a scale kept in double instead of float32 (GradScaler's tensor dtype): the
// products must round exactly as float32 does.
TEST(LossScalerTest, ScaleIsFloat32) {
  LossScaler s(Enabled(0.1, 3, 0.5, 1));
  EXPECT_EQ(s.scale(), static_cast<double>(0.1f));
  s.Update(false);
  EXPECT_EQ(s.scale(), static_cast<double>(0.1f * 3.0f));
}

// Catches: hysteresis ignored (backing off at the first overflow), never re-armed on growth,
// or re-armed on every good window (DeepSpeed re-arms it only when the scale grows).
TEST(LossScalerTest, HysteresisDelaysBackoffAndResetsOnGrowth) {
  LossScalerConfig c = Enabled(1024, 2, 0.5, 3);
  c.hysteresis = 2;
  LossScaler s(c);
  s.Update(true);  // tolerated
  EXPECT_EQ(s.scale(), 1024);
  EXPECT_EQ(s.growth_tracker(), 0);
  s.Update(true);  // second overflow: backs off
  EXPECT_EQ(s.scale(), 512);
  s.Update(true);  // hysteresis used up: backs off at once
  EXPECT_EQ(s.scale(), 256);
  s.Update(false);
  s.Update(true);  // good windows without growth do not re-arm it
  EXPECT_EQ(s.scale(), 128);
  for (int i = 0; i < 3; ++i) s.Update(false);  // growth re-arms
  EXPECT_EQ(s.scale(), 256);
  EXPECT_EQ(s.State().hysteresis_left(), 2);
  s.Update(true);
  EXPECT_EQ(s.scale(), 256);  // tolerated again
  s.Update(true);
  EXPECT_EQ(s.scale(), 128);
}

// Catches: a tolerated (hysteresis) overflow that does not restart the growth count.
TEST(LossScalerTest, ToleratedOverflowResetsGrowthTracker) {
  LossScalerConfig c = Enabled(16, 2, 0.5, 2);
  c.hysteresis = 2;
  LossScaler s(c);
  s.Update(false);
  EXPECT_EQ(s.growth_tracker(), 1);
  s.Update(true);
  EXPECT_EQ(s.growth_tracker(), 0);
  s.Update(false);
  EXPECT_EQ(s.scale(), 16);  // would be 32 if the tracker had kept counting
}

// Catches: backoff going below min_scale, or a floor applied when none is configured.
TEST(LossScalerTest, MinScaleFloor) {
  LossScalerConfig c = Enabled(4, 2, 0.5, 100);
  c.min_scale = 1.5;
  LossScaler s(c);
  s.Update(true);
  EXPECT_EQ(s.scale(), 2);
  s.Update(true);
  EXPECT_EQ(s.scale(), 1.5);
  s.Update(true);
  EXPECT_EQ(s.scale(), 1.5);

  LossScaler no_floor(Enabled(4, 2, 0.5, 100));
  for (int i = 0; i < 5; ++i) no_floor.Update(true);
  EXPECT_EQ(no_floor.scale(), 4.0 / 32);
}

// Catches: a disabled scaler (fp32/bf16) that reports S != 1 or changes on updates
// (docs/numerics.md, rule 12: bf16 runs with S = 1).
TEST(LossScalerTest, DisabledIsAlwaysOne) {
  LossScalerConfig c;  // enabled = false
  LossScaler s(c);
  EXPECT_FALSE(s.enabled());
  EXPECT_EQ(s.scale(), 1.0);
  for (int i = 0; i < 5000; ++i) s.Update(i % 3 == 0);
  EXPECT_EQ(s.scale(), 1.0);
  EXPECT_EQ(s.growth_tracker(), 0);
  const v1::ScalerState before = LossScaler(c).State();
  EXPECT_EQ(s.State().SerializeAsString(), before.SerializeAsString());
}

// Catches: State() or the restoring constructor losing scale, tracker or hysteresis, which
// would make a recovered coordinator's scaler differ from the one that crashed.
TEST(LossScalerTest, StateRoundTrip) {
  LossScalerConfig c = Enabled(256, 2, 0.5, 5);
  c.hysteresis = 3;
  LossScaler s(c);
  s.Update(false);
  s.Update(false);
  s.Update(true);  // tolerated: hysteresis_left 2, tracker 0
  s.Update(false);
  const v1::ScalerState state = s.State();
  EXPECT_EQ(state.scale(), 256);
  EXPECT_EQ(state.growth_tracker(), 1);
  EXPECT_EQ(state.hysteresis_left(), 2);

  LossScaler restored(c, state);
  EXPECT_EQ(restored.State().SerializeAsString(), state.SerializeAsString());
  for (bool inf : {false, true, true, false, false, false, false, false}) {
    s.Update(inf);
    restored.Update(inf);
    EXPECT_EQ(restored.State().SerializeAsString(), s.State().SerializeAsString());
  }
}

}  // namespace
}  // namespace trainstep
