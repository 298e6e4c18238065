// StepMachine tests: Re-run on suspicion (coordinator/step_machine/rerun.cc).
#include <limits>
#include <string>
#include <vector>

#include "coordinator/step_machine.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/coordinator/step_machine/step_machine_test_util.h"

namespace trainstep {
namespace {

using ::testing::ElementsAre;
using testing_util::Checksummed;
using testing_util::RankReport;
using testing_util::ResolvedSpec;
using testing_util::SimulatedRanks;
using testing_util::Validated;

// Catches: a NaN loss skipped without asking who computed it, the faulty rank's first run
// kept, a healthy rank blamed, or the suspect not counted (in Workers, progress and replay).
TEST(StepMachineTest, ANonFiniteLossIsRerunAndATransientFaultIsAttributedToItsRank) {
  SimulatedRanks sim(ResolvedSpec(Validated(R"({"rerun_on":["nonfinite"],"max_suspect":5})")));
  sim.Start(2);
  const std::vector<std::string> ranks = sim.Ranks();
  sim.BeginAll(1, {10, 10});
  std::vector<RankReport> first = Checksummed();
  first[1].loss_sum = std::numeric_limits<double>::quiet_NaN();  // a flipped loss on rank 1
  const v1::WindowDecision d = sim.CompleteWithRerun(1, first, Checksummed());
  EXPECT_EQ(d.outcome(), v1::COMMIT) << "decided on the first run, not the re-run";
  ASSERT_TRUE(d.record().has_rerun());
  const v1::Rerun& rerun = d.record().rerun();
  EXPECT_EQ(rerun.cause(), "nonfinite");
  EXPECT_EQ(rerun.cause_code(), v1::RERUN_CAUSE_NONFINITE);
  EXPECT_EQ(rerun.verdict(), "transient");
  EXPECT_EQ(rerun.verdict_code(), v1::RERUN_VERDICT_TRANSIENT);
  EXPECT_EQ(rerun.rank(), 1);
  EXPECT_EQ(rerun.worker_id(), ranks[1]);
  EXPECT_THAT(rerun.ranks(), ::testing::ElementsAre(1));
  EXPECT_DOUBLE_EQ(d.record().loss(), 1.0);  // the re-run's losses: 20 / 20
  EXPECT_EQ(sim.progress().optimizer_update_id(), 1);
  EXPECT_EQ(sim.progress().reruns(), 1);
  EXPECT_EQ(sim.progress().reruns_transient(), 1);
  for (const v1::WorkerInfo& w : sim.machine().Workers()) {
    EXPECT_EQ(w.suspect_count(), w.worker_id() == ranks[1] ? 1 : 0) << w.worker_id();
  }
  JobRegistry replayed(sim.options());
  for (const v1::JournalRecord& r : sim.records()) ASSERT_TRUE(replayed.Apply(r).ok());
  for (const v1::WorkerInfo& w : (*replayed.Machine(sim.job_id()))->Workers()) {
    EXPECT_EQ(w.suspect_count(), w.worker_id() == ranks[1] ? 1 : 0) << "replayed";
  }
  // A gradient that differs between runs (same loss) is a fault too.
  sim.BeginAll(2, {10, 10});
  first = Checksummed();
  first[0].found_inf = first[1].found_inf = true;  // +inf in rank 0's local gradient, summed
  first[0].grad_checksum = 7;
  const v1::WindowDecision d2 = sim.CompleteWithRerun(2, first, Checksummed());
  EXPECT_EQ(d2.outcome(), v1::COMMIT);
  EXPECT_EQ(d2.record().rerun().verdict(), "transient");
  EXPECT_EQ(d2.record().rerun().rank(), 0);
}

// Catches: a reproducible bad window blamed on a rank (it is the data), decided otherwise
// than without validate, or not naming the samples whose loss is non-finite.
TEST(StepMachineTest, AReproducedNonFiniteLossIsSkippedAndNamesItsSamples) {
  SimulatedRanks sim(ResolvedSpec(Validated(R"({"rerun_on":["nonfinite"]})")));
  sim.Start(2);
  sim.BeginAll(1, {10, 10});
  std::vector<RankReport> bad = Checksummed();
  bad[1].loss_sum = std::numeric_limits<double>::infinity();
  std::vector<RankReport> again = bad;
  again[1].sample_losses = {{17, std::numeric_limits<double>::infinity()}, {3, 0.5}};
  again[0].sample_losses = {{4, 0.9}};
  const v1::WindowDecision d = sim.CompleteWithRerun(1, bad, again);
  EXPECT_EQ(d.outcome(), v1::SKIP);
  EXPECT_EQ(d.reason_code(), v1::WINDOW_REASON_NONFINITE_LOSS);
  const v1::Rerun& rerun = d.record().rerun();
  EXPECT_EQ(rerun.verdict(), "persistent");
  EXPECT_EQ(rerun.verdict_code(), v1::RERUN_VERDICT_PERSISTENT);
  EXPECT_EQ(rerun.rank(), 1);
  EXPECT_THAT(rerun.sample_ids(), ::testing::ElementsAre(17));
  EXPECT_EQ(sim.progress().optimizer_update_id(), 0);
  for (const v1::WorkerInfo& w : sim.machine().Workers()) EXPECT_EQ(w.suspect_count(), 0);
  EXPECT_EQ(sim.progress().reruns_transient(), 0);
}

// Catches: a spike test before there is a history to measure it against, a spike not re-run,
// and skip_spikes ignored for a reproducible one.
TEST(StepMachineTest, AReproducedSpikeIsCommittedOrSkippedAsTheSpecSays) {
  for (const bool skip : {false, true}) {
    SimulatedRanks sim(ResolvedSpec(Validated(
        absl::StrCat(R"({"rerun_on":["spike"],"spike_window":3,"spike_sigma":2,"skip_spikes":)",
                     skip ? "true" : "false", "}"))));
    sim.Start(2);
    // A spike in the first window: no history, no re-run.
    std::vector<RankReport> high = Checksummed();
    high[0].loss_sum = high[1].loss_sum = 50.0;
    EXPECT_EQ(sim.RunWindow(high).outcome(), v1::COMMIT);
    for (int w = 0; w < 3; ++w) {
      std::vector<RankReport> r = Checksummed();
      r[0].loss_sum = r[1].loss_sum = 10.0 + w;  // losses 1.0, 1.1, 1.2
      EXPECT_EQ(sim.RunWindow(r).outcome(), v1::COMMIT);
    }
    const int64_t window = sim.next_window();
    sim.BeginAll(window, {10, 10});
    high[1].loss_sum = 60.0;  // rank 1's share dominates the window
    high[1].sample_losses = {{42, 400.0}, {8, 300.0}, {9, 10.0}};
    const v1::WindowDecision d = sim.CompleteWithRerun(window, high, high);
    EXPECT_EQ(d.record().rerun().cause(), "spike");
    EXPECT_EQ(d.record().rerun().verdict(), "persistent");
    EXPECT_THAT(d.record().rerun().sample_ids(), ::testing::ElementsAre(42, 8));
    EXPECT_EQ(d.outcome(), skip ? v1::SKIP : v1::COMMIT);
    if (skip) EXPECT_EQ(d.reason_code(), v1::WINDOW_REASON_LOSS_SPIKE);
  }
}

// Catches: σ computed as E[x²] − mean² (noise for close losses) or with no floor, so that
// losses equal to their last digits make a rise in those digits a "spike": every such window
// re-run, and skipped as LOSS_SPIKE under skip_spikes. A real rise is still one.
TEST(StepMachineTest, ALossRiseInItsLastDigitsIsNoSpike) {
  SimulatedRanks sim(ResolvedSpec(
      Validated(R"({"rerun_on":["spike"],"spike_window":3,"spike_sigma":6,"skip_spikes":true})")));
  sim.Start(2);
  for (int w = 0; w < 3; ++w) {
    std::vector<RankReport> r = Checksummed();
    r[0].loss_sum = r[1].loss_sum = 0.1 * 10.0 * 11.0;  // loss 1.1 each window, to rounding
    ASSERT_EQ(sim.RunWindow(r).outcome(), v1::COMMIT);
  }
  std::vector<RankReport> close = Checksummed();
  close[0].loss_sum = close[1].loss_sum = 11.0 * (1.0 + 1e-9);
  const v1::WindowDecision d = sim.RunWindow(close);
  EXPECT_EQ(d.outcome(), v1::COMMIT);
  EXPECT_FALSE(d.record().has_rerun()) << d.record().rerun().ShortDebugString();

  const int64_t window = sim.next_window();
  sim.BeginAll(window, {10, 10});
  std::vector<RankReport> risen = Checksummed();
  risen[0].loss_sum = risen[1].loss_sum = 11.0 * 1.01;  // 1 % up from constant losses
  const v1::WindowDecision spike = sim.CompleteWithRerun(window, risen, risen);
  EXPECT_EQ(spike.record().rerun().cause(), "spike");
  EXPECT_EQ(spike.outcome(), v1::SKIP);
}

// Catches: a re-run report reaching a coordinator that never asked for it (it restarted and
// lost the first run's reports) decided as if it were a first run; and, when the restarted
// coordinator heard nothing else of the window (ranks stop re-sending their begin reports
// once their all-reduce ran), answered "aborted: rejoin" with nothing aborted: no record, the
// generation left live, the ranks stuck until their heartbeats ended it.
TEST(StepMachineTest, AReRunNobodyAskedForAbortsTheWindow) {
  for (const bool begun : {true, false}) {
    SCOPED_TRACE(begun ? "begin reports seen" : "nothing seen of the window");
    SimulatedRanks sim(ResolvedSpec(Validated(R"({"rerun_on":["nonfinite"]})")));
    sim.Start(2);
    if (begun) {
      sim.BeginAll(1, {10, 10});
    } else {
      sim.registry().Restore(sim.registry().Snapshot(), sim.now());
      sim.registry().Recovered(sim.now());
    }
    // Both ranks' re-run reports get the same answer: the window aborted, both rejoin.
    const int64_t generation = sim.generation();
    for (int rank = 0; rank < 2; ++rank) {
      RankReport second = Checksummed()[rank];
      second.run = 2;
      v1::CompleteWindowRequest req = sim.CompleteRequest(rank, 1, second);
      req.set_generation(generation);  // the ranks' own, whether or not the next one formed
      auto a = sim.Complete(req);
      ASSERT_TRUE(a.ok()) << a.status();
      ASSERT_TRUE(a->ready);
      EXPECT_EQ(a->response.decision().outcome(), v1::ABORT);
      EXPECT_EQ(a->response.decision().reason_code(), v1::WINDOW_REASON_RERUN_INTERRUPTED);
    }
    EXPECT_EQ(sim.progress().windows_aborted(), 1) << "the abort was not recorded";
  }
}

}  // namespace
}  // namespace trainstep
