// StepMachine tests: The job as the client sees it (coordinator/step_machine/job_view.cc).
#include <string>
#include <vector>

#include "coordinator/step_machine.h"
#include "gtest/gtest.h"
#include "tests/unit/coordinator/step_machine/step_machine_test_util.h"

namespace trainstep {
namespace {

using testing_util::Elastic;
using testing_util::RankReport;
using testing_util::Reports;
using testing_util::ResolvedSpec;
using testing_util::SimulatedRanks;
using testing_util::SpecOptions;

// Catches a coordinator restarted while a job waited for workers still saying "waiting for
// workers" once a generation formed: the snapshot's progress outlived what it described (the
// journal_replay fuzzer's finding: restored and replayed registries diverged).
TEST(StepMachineTest, WaitingForWorkersDoesNotOutliveARestart) {
  SimulatedRanks sim(ResolvedSpec(Elastic(3, 2, "1s")));
  const std::vector<std::string> g1 = sim.Start(3);
  sim.RunWindow();
  sim.Lose({g1[1], g1[2]});
  sim.Advance(absl::Seconds(2));
  sim.HeartbeatAllExcept({});
  sim.Tick();
  ASSERT_FALSE(sim.progress().waiting().empty());
  ASSERT_EQ(sim.progress().workers_available(), 1);

  sim.registry().Restore(sim.registry().Snapshot(), sim.now());
  sim.registry().Recovered(sim.now());
  sim.HeartbeatAllExcept({});
  sim.Start(1);  // a second worker: a generation of 2 forms once the join grace ends
  sim.Advance(absl::Seconds(1));
  sim.HeartbeatAllExcept({});
  sim.Tick();
  ASSERT_EQ(sim.progress().world_size(), 2);
  EXPECT_EQ(sim.progress().waiting(), "");
  EXPECT_EQ(sim.progress().workers_available(), 0);
}

// Straggler scores: each decided window's phase reports score the ranks; a rank reporting
// three times the compute time of the others scores 1/3 relative, in Workers() and in the
// job's progress by rank, and the scores stay after the job ended. Catches scores computed
// against the wrong rank, lost between the report and the query, or not filled in.
TEST(StepMachineTest, PhaseReportsScoreEachRank) {
  SpecOptions o;
  o.workers = 3;
  o.max_updates = 4;
  SimulatedRanks sim(ResolvedSpec(o));
  sim.Start(3);
  EXPECT_TRUE(sim.job().progress().rank_scores().empty());  // nothing scored yet
  for (int w = 0; w < 4; ++w) {
    std::vector<RankReport> reports = Reports(3);
    for (RankReport& r : reports) r.compute_seconds = 0.1;
    reports[2].compute_seconds = 0.3;
    EXPECT_EQ(sim.RunWindow(reports).outcome(), v1::COMMIT);
  }
  const v1::Job job = sim.job();
  EXPECT_EQ(job.state(), v1::SUCCEEDED);
  ASSERT_EQ(job.progress().rank_scores_size(), 3);
  for (int rank = 0; rank < 3; ++rank) {
    const v1::RankScore& score = job.progress().rank_scores(rank);
    EXPECT_EQ(score.rank(), rank);
    EXPECT_EQ(score.worker_id(), sim.Ranks().at(rank));
    EXPECT_EQ(score.windows(), 4);
    EXPECT_NEAR(score.relative(), rank == 2 ? 1.0 / 3.0 : 1.0, 1e-9) << rank;
    EXPECT_NEAR(score.phases().compute_seconds(), rank == 2 ? 0.3 : 0.1, 1e-9) << rank;
  }
  int scored = 0;
  for (const v1::WorkerInfo& w : sim.machine().Workers()) {
    if (!w.has_score()) continue;
    ++scored;
    EXPECT_NEAR(w.score().relative(), w.worker_id() == sim.Ranks().at(2) ? 1.0 / 3.0 : 1.0, 1e-9);
  }
  EXPECT_EQ(scored, 3);
}

// Reports without phases (an older worker) leave the job unscored rather than scoring zeros.
TEST(StepMachineTest, ReportsWithoutPhasesAreNotScored) {
  SimulatedRanks sim(ResolvedSpec({}));
  sim.Start(2);
  EXPECT_EQ(sim.RunWindow().outcome(), v1::COMMIT);
  EXPECT_TRUE(sim.job().progress().rank_scores().empty());
  for (const v1::WorkerInfo& w : sim.machine().Workers()) EXPECT_FALSE(w.has_score());
}

}  // namespace
}  // namespace trainstep
