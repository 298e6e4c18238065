#include "common/clock.h"

#include <gtest/gtest.h>

#include "absl/time/clock.h"

namespace trainstep {
namespace {

// Catches: a FakeClock that moves by itself, or by other than what a test advanced it.
TEST(ClockTest, FakeClockMovesOnlyWhenAdvanced) {
  FakeClock clock;
  const absl::Time start = clock.Now();
  absl::SleepFor(absl::Milliseconds(2));
  EXPECT_EQ(clock.Now(), start);
  clock.Advance(absl::Seconds(3));
  EXPECT_EQ(clock.Now() - start, absl::Seconds(3));
}

// Catches: a stopwatch that counts from the wrong point (not its start, not its Restart) or
// in the wrong unit (milliseconds as seconds). Sleeping gives lower bounds only.
TEST(ClockTest, StopwatchCountsSecondsFromItsStartAndRestart) {
  Stopwatch watch;
  absl::SleepFor(absl::Milliseconds(20));
  const double first = watch.Seconds();
  EXPECT_GE(first, 0.02);
  EXPECT_LT(first, 10.0) << "not seconds (20 ms is 20 in milliseconds)";
  watch.Restart();
  const double after_restart = watch.Seconds();
  EXPECT_GE(after_restart, 0.0);
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_GE(watch.Seconds(), after_restart + 0.02);
}

}  // namespace
}  // namespace trainstep
