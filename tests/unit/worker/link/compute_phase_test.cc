// Where the worker's compute thread is (worker/link/compute_phase.h), as its heartbeats and its
// health service read it.
#include "worker/link/compute_phase.h"

#include "common/clock.h"
#include "gtest/gtest.h"

namespace trainstep {
namespace {

// Catches the time in a phase restarting when the training loop enters the phase it is
// already in (a stuck data read re-entered by each micro-batch would never look stuck), and
// Stuck() judging without the coordinator's deadline or against the wrong one.
TEST(ComputePhaseTest, StuckOnlyInItsOwnWorkPastTheDeadlineOfThatStep) {
  FakeClock clock;
  ComputePhase phase(&clock);
  phase.Enter(v1::COMPUTE_PHASE_DATA);
  clock.Advance(absl::Seconds(3));
  phase.Enter(v1::COMPUTE_PHASE_DATA);
  EXPECT_EQ(phase.Read().in_phase, absl::Seconds(3));
  clock.Advance(absl::Seconds(60));
  EXPECT_FALSE(phase.Stuck()) << "no deadline known yet";

  phase.SetDeadlines(absl::Seconds(5), absl::Seconds(600));
  EXPECT_TRUE(phase.Stuck());
  phase.Enter(v1::COMPUTE_PHASE_REPORT);  // waiting for the others: never its own fault
  clock.Advance(absl::Seconds(700));
  EXPECT_FALSE(phase.Stuck());
  phase.Enter(v1::COMPUTE_PHASE_EVAL);  // a long step: the cap
  clock.Advance(absl::Seconds(599));
  EXPECT_FALSE(phase.Stuck());
  clock.Advance(absl::Seconds(2));
  EXPECT_TRUE(phase.Stuck());
  EXPECT_EQ(phase.Read().phase, v1::COMPUTE_PHASE_EVAL);
}

}  // namespace
}  // namespace trainstep
