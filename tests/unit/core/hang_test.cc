// The hang deadline (core/hang.h): what the coordinator fences by and the worker's health
// reports by.
#include "core/hang.h"

#include "gtest/gtest.h"

namespace trainstep {
namespace {

// Catches a deadline that does not follow the job: fast windows must not make it shorter than
// the floor (a busy host's hiccup is no hang), slow ones must stretch it, and no window may
// stretch it past the cap; before any window the cap holds (the first windows warm up).
TEST(HangTest, TheShortStepDeadlineIsFactorTimesTheSlowestRecentWindowWithinFloorAndCap) {
  HangPolicy p;  // the defaults: 5 s, 600 s, × 10
  EXPECT_EQ(ShortStepDeadline(p, std::nullopt), absl::Seconds(600));
  EXPECT_EQ(ShortStepDeadline(p, absl::Milliseconds(2)), absl::Seconds(5));
  EXPECT_EQ(ShortStepDeadline(p, absl::Seconds(2)), absl::Seconds(20));
  EXPECT_EQ(ShortStepDeadline(p, absl::Seconds(100)), absl::Seconds(600));
  p.floor = p.cap = absl::Seconds(30);  // a fixed deadline
  EXPECT_EQ(ShortStepDeadline(p, absl::Seconds(100)), absl::Seconds(30));
  EXPECT_EQ(ShortStepDeadline(p, absl::Milliseconds(1)), absl::Seconds(30));
}

// Catches a long step (evaluation, checkpoint) held to a window's deadline, and waits counted
// as the waiting rank's own fault.
TEST(HangTest, OwnWorkAndWaitsAreToldApart) {
  const HangPolicy p;
  EXPECT_EQ(PhaseDeadline(p, v1::COMPUTE_PHASE_FORWARD_BACKWARD, absl::Seconds(7)),
            absl::Seconds(7));
  EXPECT_EQ(PhaseDeadline(p, v1::COMPUTE_PHASE_EVAL, absl::Seconds(7)), absl::Seconds(600));
  for (v1::ComputePhase own :
       {v1::COMPUTE_PHASE_DATA, v1::COMPUTE_PHASE_FORWARD_BACKWARD, v1::COMPUTE_PHASE_OPTIMIZER,
        v1::COMPUTE_PHASE_EVAL, v1::COMPUTE_PHASE_CHECKPOINT}) {
    EXPECT_TRUE(IsOwnWork(own)) << PhaseName(own);
    EXPECT_FALSE(IsWaitForPeers(own)) << PhaseName(own);
  }
  for (v1::ComputePhase wait :
       {v1::COMPUTE_PHASE_REPORT, v1::COMPUTE_PHASE_ALLREDUCE, v1::COMPUTE_PHASE_JOIN}) {
    EXPECT_TRUE(IsWaitForPeers(wait)) << PhaseName(wait);
    EXPECT_FALSE(IsOwnWork(wait)) << PhaseName(wait);
  }
  EXPECT_FALSE(IsOwnWork(v1::COMPUTE_PHASE_IDLE));
  EXPECT_FALSE(IsOwnWork(v1::COMPUTE_PHASE_UNSPECIFIED));
}

}  // namespace
}  // namespace trainstep
