// StepMachine tests: Replay and restore (coordinator/step_machine/replay.cc).
#include <string>

#include "absl/status/status.h"
#include "coordinator/step_machine.h"
#include "gtest/gtest.h"
#include "tests/unit/coordinator/step_machine/step_machine_test_util.h"

namespace trainstep {
namespace {

using testing_util::RankReport;
using testing_util::ResolvedSpec;
using testing_util::SimulatedRanks;
using testing_util::WithEval;

// Catches: a restored machine that forgets the desync streak (a crash-looping coordinator
// would retry a diverged job forever).
TEST(StepMachineTest, DesyncStreakSurvivesRestore) {
  SimulatedRanks sim(ResolvedSpec({}));
  sim.Start(2);
  RankReport good;
  RankReport bad = good;
  bad.grad_norm = 7.0;
  sim.RunWindow({good, bad});
  sim.RunWindow({good, bad});
  sim.registry().Restore(sim.registry().Snapshot(), sim.now());
  EXPECT_EQ(sim.state(), v1::RUNNING);
  sim.RunWindow({good, bad});
  EXPECT_EQ(sim.state(), v1::FAILED);
}

// Catches a journaled evaluation of an update that was never committed becoming the job's
// latest eval loss after replay, but not after a restore from the snapshot that replay
// writes (the journal_replay fuzzer's finding): it fits nothing and changes nothing.
TEST(StepMachineTest, AnEvaluationOfNoCommittedUpdateChangesNothing) {
  SimulatedRanks sim(ResolvedSpec(WithEval(1)));
  sim.Start(2);
  ASSERT_EQ(sim.RunWindow().outcome(), v1::COMMIT);
  const std::string before = sim.registry().Snapshot().DebugString();
  v1::JournalRecord record;
  record.set_time_ms(absl::ToUnixMillis(sim.now()));
  v1::EvalEnded* e = record.mutable_eval_ended();
  e->set_job_id(sim.job_id());
  e->set_generation(1);
  e->set_optimizer_update_id(7);
  e->set_eval_loss(0.0);
  ASSERT_TRUE(sim.registry().Apply(record).ok());
  EXPECT_FALSE(sim.progress().has_last_eval_loss());
  EXPECT_EQ(sim.registry().Snapshot().DebugString(), before);
}

// Catches: an evaluation state lost on a coordinator restart (replay or snapshot): the result
// must stay on its record, and an evaluation in progress must still gate the next window.
TEST(StepMachineTest, EvalSurvivesReplayAndSnapshot) {
  SimulatedRanks sim(ResolvedSpec(WithEval(1)));
  sim.Start(2);
  sim.RunWindow();
  ASSERT_TRUE(sim.Eval(0, 1, 3, 1)->ready == false);
  ASSERT_TRUE(sim.Eval(1, 1, 1, 1)->ready);
  sim.RunWindow();  // update 2: its evaluation is due

  // Replay the journal into a fresh registry.
  JobRegistry replayed{MachineOptions{}};
  for (const v1::JournalRecord& r : sim.records()) {
    const absl::Status applied = replayed.Apply(r);
    ASSERT_TRUE(applied.ok()) << applied;
  }
  const StepMachine& m = **replayed.Machine(sim.job_id());
  ASSERT_EQ(m.updates().size(), 2u);
  EXPECT_DOUBLE_EQ(m.updates()[0].eval_loss(), 2.0);
  EXPECT_FALSE(m.updates()[1].has_eval_loss());
  EXPECT_EQ(m.WatchableUpdates(), 1u);  // update 2 still waits for its evaluation
  EXPECT_EQ(m.Job().progress().last_eval_update_id(), 1);

  // Restore from a snapshot: the due evaluation gates window 3 and completes as before.
  sim.registry().Restore(sim.registry().Snapshot(), sim.now());
  EXPECT_DOUBLE_EQ(sim.progress().last_eval_loss(), 2.0);
  EXPECT_FALSE(sim.Begin(0, 3, 10)->ready);
  EXPECT_FALSE(sim.Begin(1, 3, 10)->ready);
  ASSERT_FALSE(sim.Eval(0, 2, 1, 1)->ready);
  ASSERT_TRUE(sim.Eval(1, 2, 1, 1)->ready);
  EXPECT_TRUE(sim.Begin(1, 3, 10)->ready);
  EXPECT_DOUBLE_EQ(sim.machine().updates()[1].eval_loss(), 1.0);
}

}  // namespace
}  // namespace trainstep
