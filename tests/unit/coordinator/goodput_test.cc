// Goodput (coordinator/goodput.h): where a job's wall time went since its first commit.
#include "coordinator/goodput.h"

#include "gtest/gtest.h"

namespace trainstep {
namespace {

// One record of the per-update log: a window of `generation` ending at `end_ms`, committing
// `update` after `interval` seconds (a skip or an abort when `outcome` says so).
v1::UpdateRecord Record(int64_t generation, int64_t update, int64_t end_ms, double interval,
                        v1::WindowOutcome outcome = v1::COMMIT) {
  v1::UpdateRecord r;
  r.set_generation(generation);
  r.set_outcome_code(outcome);
  r.set_outcome(outcome == v1::COMMIT ? "commit" : outcome == v1::SKIP ? "skip" : "abort");
  r.set_optimizer_update_id(update);
  r.set_end_time_ms(end_ms);
  if (outcome == v1::COMMIT) r.set_update_interval_seconds(interval);
  return r;
}

// Catches time lost to a fault counted as training: the commit after a lost rank (a new
// generation, an aborted window) is re-forming, an update committed again after a rollback is
// a loss, a skipped window's time is not committed; and the wall time starting before the
// first commit (the processes' start is not the job's fault).
TEST(GoodputTest, EachCommitsIntervalCountsToOneCause) {
  GoodputLedger g;
  EXPECT_EQ(g.Report().wall_seconds(), 0);
  g.Add(Record(1, 1, 10'000, 9.0));  // the first commit: the wall starts here
  g.Add(Record(1, 2, 11'000, 1.0));  // steady
  g.Add(Record(1, 3, 12'000, 1.0));  // steady
  g.Add(Record(1, 3, 12'500, 0, v1::ABORT));
  g.Add(Record(2, 4, 16'000, 4.0));  // after the abort, in a new generation: re-forming
  g.Add(Record(2, 4, 16'500, 0, v1::SKIP));
  g.Add(Record(2, 5, 18'000, 2.0));  // after a skipped window
  g.Add(Record(3, 4, 21'000, 3.0));  // update 4 again: rolled back
  g.Add(Record(3, 5, 22'000, 1.0));  // update 5 again
  g.Add(Record(3, 6, 23'000, 1.0));  // steady
  v1::Goodput r = g.Report();
  EXPECT_DOUBLE_EQ(r.wall_seconds(), 13.0);
  EXPECT_DOUBLE_EQ(r.productive_seconds(), 3.0);
  EXPECT_DOUBLE_EQ(r.reform_seconds(), 4.0);
  EXPECT_DOUBLE_EQ(r.skipped_seconds(), 2.0);
  EXPECT_DOUBLE_EQ(r.rollback_seconds(), 4.0);
  EXPECT_DOUBLE_EQ(r.ratio(), 3.0 / 13.0);

  // Decisions held while the journal could not be written come out of the steady pace.
  g.AddStorageHold(absl::Seconds(1));
  r = g.Report();
  EXPECT_DOUBLE_EQ(r.storage_seconds(), 1.0);
  EXPECT_DOUBLE_EQ(r.productive_seconds(), 2.0);
  EXPECT_DOUBLE_EQ(r.ratio(), 2.0 / 13.0);
}

}  // namespace
}  // namespace trainstep
