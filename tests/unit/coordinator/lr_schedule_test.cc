#include "coordinator/lr_schedule.h"

#include <cmath>
#include <cstdint>

#include "gtest/gtest.h"
#include "tests/unit/coordinator/machine_test_util.h"

namespace trainstep {
namespace {

using testing_util::ResolvedSpec;
using testing_util::SpecOptions;

constexpr double kPi = 3.14159265358979323846;

v1::Schedule Decay(bool cosine, int64_t warmup, int64_t total, double min_ratio) {
  v1::Schedule s;
  v1::WarmupDecay* d = cosine ? s.mutable_warmup_cosine() : s.mutable_warmup_linear();
  d->set_warmup_updates(warmup);
  d->set_total_updates(total);
  d->set_min_lr_ratio(min_ratio);
  return s;
}

// The formula of lr_schedule.h, written again here so that a shared mistake cannot hide.
double Expected(bool cosine, int64_t warmup, int64_t total, double m, int64_t step) {
  if (step < warmup) return (step + 1.0) / warmup;
  double p = total == warmup ? 1.0 : (step - warmup) / static_cast<double>(total - warmup);
  p = p < 0 ? 0 : (p > 1 ? 1 : p);
  return cosine ? m + (1 - m) * 0.5 * (1 + std::cos(kPi * p)) : m + (1 - m) * (1 - p);
}

// Catches: a constant (or unset) schedule that still decays or warms up.
TEST(LrScheduleTest, ConstantIsOne) {
  v1::Schedule constant;
  constant.mutable_constant();
  v1::Schedule unset;
  for (int64_t step : {0, 1, 7, 1000000}) {
    EXPECT_EQ(LrFactor(constant, step), 1.0);
    EXPECT_EQ(LrFactor(unset, step), 1.0);
  }
}

// Catches: warmup starting at lr 0 (step/W: the first update wasted) or off by one at its end.
TEST(LrScheduleTest, WarmupIsStepPlusOneOverW) {
  for (bool cosine : {true, false}) {
    const v1::Schedule s = Decay(cosine, 4, 20, 0.0);
    EXPECT_DOUBLE_EQ(LrFactor(s, 0), 0.25);
    EXPECT_DOUBLE_EQ(LrFactor(s, 1), 0.5);
    EXPECT_DOUBLE_EQ(LrFactor(s, 2), 0.75);
    EXPECT_DOUBLE_EQ(LrFactor(s, 3), 1.0);
    EXPECT_DOUBLE_EQ(LrFactor(s, 4), 1.0);  // decay starts at p = 0
  }
}

// Catches: a wrong cosine closed form (half period, missing ½, p not normalised by T - W).
TEST(LrScheduleTest, CosineClosedForm) {
  const v1::Schedule s = Decay(true, 10, 110, 0.0);
  EXPECT_DOUBLE_EQ(LrFactor(s, 10), 1.0);
  EXPECT_NEAR(LrFactor(s, 35), 0.5 * (1 + std::cos(kPi * 0.25)), 1e-12);
  EXPECT_NEAR(LrFactor(s, 60), 0.5, 1e-12);
  EXPECT_NEAR(LrFactor(s, 110), 0.0, 1e-12);
  for (int64_t step = 0; step <= 130; ++step) {
    EXPECT_NEAR(LrFactor(s, step), Expected(true, 10, 110, 0.0, step), 1e-12) << step;
  }
}

// Catches: a wrong linear closed form.
TEST(LrScheduleTest, LinearClosedForm) {
  const v1::Schedule s = Decay(false, 0, 100, 0.0);
  EXPECT_DOUBLE_EQ(LrFactor(s, 0), 1.0);
  EXPECT_DOUBLE_EQ(LrFactor(s, 25), 0.75);
  EXPECT_DOUBLE_EQ(LrFactor(s, 50), 0.5);
  EXPECT_DOUBLE_EQ(LrFactor(s, 100), 0.0);
  for (int64_t step = 0; step <= 120; ++step) {
    EXPECT_NEAR(LrFactor(s, step), Expected(false, 0, 100, 0.0, step), 1e-12) << step;
  }
}

// Catches: p not clamped past total_updates (cosine coming back up, linear going negative).
TEST(LrScheduleTest, ClampedBeyondTotal) {
  const v1::Schedule cos = Decay(true, 2, 10, 0.1);
  const v1::Schedule lin = Decay(false, 2, 10, 0.1);
  for (int64_t step : {10, 11, 15, 18, 1000}) {
    EXPECT_NEAR(LrFactor(cos, step), 0.1, 1e-12) << step;
    EXPECT_NEAR(LrFactor(lin, step), 0.1, 1e-12) << step;
  }
}

// Catches: min_lr_ratio ignored or applied as a floor instead of rescaling the decay.
TEST(LrScheduleTest, MinLrRatio) {
  const double m = 0.2;
  for (bool cosine : {true, false}) {
    const v1::Schedule s = Decay(cosine, 5, 45, m);
    EXPECT_NEAR(LrFactor(s, 5), 1.0, 1e-12);
    EXPECT_NEAR(LrFactor(s, 25), m + (1 - m) * 0.5, 1e-12);  // p = ½ in both forms
    EXPECT_NEAR(LrFactor(s, 45), m, 1e-12);
    for (int64_t step = 0; step < 60; ++step) {
      EXPECT_NEAR(LrFactor(s, step), Expected(cosine, 5, 45, m, step), 1e-12) << step;
    }
  }
}

// Catches: a division by zero (NaN lr) when total_updates == warmup_updates.
TEST(LrScheduleTest, NoDecayPhase) {
  const v1::Schedule s = Decay(true, 3, 3, 0.5);
  EXPECT_NEAR(LrFactor(s, 2), 1.0, 1e-12);
  EXPECT_TRUE(std::isfinite(LrFactor(s, 3)));
  EXPECT_NEAR(LrFactor(s, 3), Expected(true, 3, 3, 0.5, 3), 1e-12);
}

// Catches: LearningRate reading the wrong optimizer's lr or not applying the factor.
TEST(LrScheduleTest, LearningRateIsBaseTimesFactor) {
  SpecOptions o;
  o.lr = 0.4;
  o.max_updates = 20;
  o.schedule = R"({"warmup_linear":{"warmup_updates":4,"total_updates":20,"min_lr_ratio":0.1}})";
  const v1::JobSpec sgd = ResolvedSpec(o);
  for (int64_t step : {0, 3, 4, 12, 20, 30}) {
    EXPECT_NEAR(LearningRate(sgd, step), 0.4 * Expected(false, 4, 20, 0.1, step), 1e-12) << step;
  }
  v1::JobSpec adamw = sgd;
  adamw.mutable_optimizer()->mutable_adamw()->set_lr(0.003);
  EXPECT_NEAR(LearningRate(adamw, 12), 0.003 * Expected(false, 4, 20, 0.1, 12), 1e-15);

  SpecOptions c;  // constant schedule by default
  c.lr = 0.25;
  EXPECT_EQ(LearningRate(ResolvedSpec(c), 0), 0.25);
  EXPECT_EQ(LearningRate(ResolvedSpec(c), 999), 0.25);
}

}  // namespace
}  // namespace trainstep
