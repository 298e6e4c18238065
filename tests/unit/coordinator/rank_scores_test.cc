// RankScores: the straggler scores. Each test names the bug it catches.
#include "coordinator/rank_scores.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace trainstep {
namespace {

RankScores::Sample Rank(const std::string& worker, double compute, int64_t units = 100) {
  RankScores::Sample s;
  s.worker_id = worker;
  s.units = units;
  s.phases.set_compute_seconds(compute);
  return s;
}

// A rank three times slower than the others scores 1/3 relative, the others 1: the score is
// fastest ÷ this rank, not this rank ÷ the mean (which would score everyone below 1).
TEST(RankScoresTest, ASlowRankScoresTheRatioToTheFastest) {
  RankScores scores(/*window_count=*/5);
  for (int w = 0; w < 10; ++w) {
    scores.Observe({Rank("a", 0.1), Rank("b", 0.3), Rank("c", 0.1)});
  }
  EXPECT_DOUBLE_EQ(scores.Find("a")->relative(), 1.0);
  EXPECT_NEAR(scores.Find("b")->relative(), 1.0 / 3.0, 1e-12);
  EXPECT_DOUBLE_EQ(scores.Find("c")->relative(), 1.0);
  EXPECT_EQ(scores.Find("b")->rank(), 1);
  EXPECT_EQ(scores.Find("b")->windows(), 10);
  EXPECT_EQ(scores.Find("b")->worker_id(), "b");
  EXPECT_FALSE(scores.Find("d").has_value());
}

// Compute time is compared per unit: a rank with half the tokens and half the time is as fast,
// not twice as fast (variable-length shares would otherwise make stragglers of full ones).
TEST(RankScoresTest, ComparesTimePerUnitNotPerWindow) {
  RankScores scores(3);
  scores.Observe({Rank("a", 0.2, 200), Rank("b", 0.1, 100)});
  EXPECT_DOUBLE_EQ(scores.Find("a")->relative(), 1.0);
  EXPECT_DOUBLE_EQ(scores.Find("b")->relative(), 1.0);
}

// Smoothing: one slow window among `window_count` moves the score by its share only; after
// the window count has passed, it is forgotten.
TEST(RankScoresTest, OneSlowWindowIsSmoothedAndThenForgotten) {
  RankScores scores(4);
  for (int w = 0; w < 4; ++w) scores.Observe({Rank("a", 0.1), Rank("b", 0.1)});
  scores.Observe({Rank("a", 0.1), Rank("b", 0.5)});  // b: 0.1, 0.1, 0.1, 0.5 → mean 0.2
  EXPECT_NEAR(scores.Find("b")->relative(), 0.5, 1e-12);
  for (int w = 0; w < 4; ++w) scores.Observe({Rank("a", 0.1), Rank("b", 0.1)});
  EXPECT_NEAR(scores.Find("b")->relative(), 1.0, 1e-12);
}

// The individual score compares a worker with its own best full-window average: a rank that
// slows down is seen even when every rank slows down together (relative stays 1).
TEST(RankScoresTest, IndividualScoreSeesAWorkerSlowerThanItsBest) {
  RankScores scores(2);
  for (int w = 0; w < 4; ++w) scores.Observe({Rank("a", 0.1), Rank("b", 0.1)});
  for (int w = 0; w < 2; ++w) scores.Observe({Rank("a", 0.4), Rank("b", 0.4)});
  EXPECT_DOUBLE_EQ(scores.Find("a")->relative(), 1.0);
  EXPECT_NEAR(scores.Find("a")->individual(), 0.25, 1e-12);
  EXPECT_NEAR(scores.Find("b")->individual(), 0.25, 1e-12);
}

// Before its first full window a worker has no best: its individual score is 1, not a
// comparison with a cold first window.
TEST(RankScoresTest, NoIndividualScoreBeforeAFullWindow) {
  RankScores scores(10);
  scores.Observe({Rank("a", 0.9)});
  scores.Observe({Rank("a", 0.1)});
  EXPECT_DOUBLE_EQ(scores.Find("a")->individual(), 1.0);
}

// A rank that reported no phases, no units or a zero time says nothing of its speed: it is
// neither scored nor taken as the fastest (which would make every other rank a straggler).
TEST(RankScoresTest, RanksWithoutTimesOrUnitsAreNotScored) {
  RankScores scores(3);
  scores.Observe({Rank("a", 0.1), Rank("b", 0.0), Rank("c", 0.1, 0)});
  EXPECT_DOUBLE_EQ(scores.Find("a")->relative(), 1.0);
  EXPECT_FALSE(scores.Find("b").has_value());
  EXPECT_FALSE(scores.Find("c").has_value());
}

// The phases shown are the mean over the same windows as the scores.
TEST(RankScoresTest, ReportsMeanPhasesOverTheScoredWindows) {
  RankScores scores(2);
  RankScores::Sample s = Rank("a", 0.1);
  s.phases.set_data_seconds(0.01);
  s.phases.set_allreduce_seconds(0.02);
  s.phases.set_coordinator_seconds(0.004);
  scores.Observe({s});
  s.phases.set_compute_seconds(0.3);
  s.phases.set_coordinator_seconds(0.002);
  scores.Observe({s});
  const v1::WindowPhases p = scores.Find("a")->phases();
  EXPECT_NEAR(p.compute_seconds(), 0.2, 1e-12);
  EXPECT_NEAR(p.data_seconds(), 0.01, 1e-12);
  EXPECT_NEAR(p.allreduce_seconds(), 0.02, 1e-12);
  EXPECT_NEAR(p.coordinator_seconds(), 0.003, 1e-12);
}

// A worker keeps its scores across generations (it is the same machine), with the rank of
// the latest window it ranked in.
TEST(RankScoresTest, FollowsTheWorkerAcrossRanks) {
  RankScores scores(2);
  scores.Observe({Rank("a", 0.1), Rank("b", 0.2)});
  scores.Observe({Rank("b", 0.2), Rank("a", 0.1)});
  EXPECT_EQ(scores.Find("b")->rank(), 0);
  EXPECT_EQ(scores.Find("b")->windows(), 2);
  EXPECT_NEAR(scores.Find("b")->relative(), 0.5, 1e-12);
}

// The replacement streak counts scored windows in a row below the threshold and restarts at
// the first one above it: catches a streak that keeps counting after the rank recovered (a
// transient slowdown would then drain it) and one counted without a policy.
TEST(RankScoresTest, WindowsBelowCountsTheStreakAndRestartsWhenTheRankRecovers) {
  RankScores scores(/*window_count=*/1, /*below=*/0.5);
  for (int w = 0; w < 3; ++w) scores.Observe({Rank("a", 0.1), Rank("b", 0.3)});
  EXPECT_EQ(scores.Find("b")->windows_below(), 3);
  EXPECT_EQ(scores.Find("a")->windows_below(), 0);
  scores.Observe({Rank("a", 0.1), Rank("b", 0.1)});  // recovered
  EXPECT_EQ(scores.Find("b")->windows_below(), 0);
  scores.Observe({Rank("a", 0.1), Rank("b", 0.4)});
  EXPECT_EQ(scores.Find("b")->windows_below(), 1);

  RankScores no_policy(1);
  for (int w = 0; w < 3; ++w) no_policy.Observe({Rank("a", 0.1), Rank("b", 0.3)});
  EXPECT_EQ(no_policy.Find("b")->windows_below(), 0);
}

}  // namespace
}  // namespace trainstep
