// StepMachine tests: Evaluation and checkpoints (coordinator/step_machine/eval_checkpoint.cc).
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "coordinator/step_machine.h"
#include "core/window_outcome.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/coordinator/step_machine/step_machine_test_util.h"

namespace trainstep {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing_util::CodeOf;
using testing_util::MessageOf;
using testing_util::RankReport;
using testing_util::Reports;
using testing_util::ResolvedSpec;
using testing_util::SimulatedRanks;
using testing_util::SpecOptions;
using testing_util::WithCheckpoints;
using testing_util::WithEval;

std::vector<v1::EvalEnded> EvalRecords(const std::vector<v1::JournalRecord>& records) {
  std::vector<v1::EvalEnded> out;
  for (const v1::JournalRecord& r : records) {
    if (r.has_eval_ended()) out.push_back(r.eval_ended());
  }
  return out;
}

// A job that stops after `updates` updates, checkpointed only at its end (every 100 updates).
SpecOptions MaxUpdatesWithCheckpoints(int64_t updates) {
  SpecOptions o = WithCheckpoints(100);
  o.max_updates = updates;
  return o;
}

// Catches: an eval loss that is a mean of the ranks' means (2.0 here) instead of Σ loss ÷ Σ
// tokens (1.0), an evaluation asked for off its interval, a next window that starts before the
// evaluation is recorded, and a result that never reaches the update's record and the progress.
TEST(StepMachineTest, EvalAtItsIntervalIsTokenWeightedAndGatesTheNextWindow) {
  SimulatedRanks sim(ResolvedSpec(WithEval(2)));
  sim.Start(2);
  EXPECT_FALSE(sim.RunWindow().run_eval());
  const v1::WindowDecision d2 = sim.RunWindow();
  ASSERT_EQ(d2.optimizer_update_id(), 2);
  ASSERT_TRUE(d2.run_eval());
  // Watchers get the commit only with its evaluation.
  EXPECT_EQ(sim.machine().WatchableUpdates(), sim.machine().updates().size() - 1);

  // Window 3's begin barrier waits for the evaluation.
  ASSERT_TRUE(sim.Begin(0, 3, 10)->ready == false);
  ASSERT_TRUE(sim.Begin(1, 3, 10)->ready == false);

  auto e0 = sim.Eval(0, 2, /*loss_sum=*/30.0, /*units=*/10);  // mean 3.0
  ASSERT_TRUE(e0.ok()) << e0.status();
  EXPECT_FALSE(e0->ready);
  EXPECT_TRUE(EvalRecords(sim.records()).empty());            // nothing half recorded
  auto e1 = sim.Eval(1, 2, /*loss_sum=*/10.0, /*units=*/30);  // mean 0.33
  ASSERT_TRUE(e1.ok()) << e1.status();
  ASSERT_TRUE(e1->ready);
  EXPECT_DOUBLE_EQ(e1->response.eval_loss(), 1.0);
  EXPECT_EQ(e1->response.valid_units(), 40);
  // The first rank's repeated call gets the same answer.
  auto again = sim.Eval(0, 2, 30.0, 10);
  ASSERT_TRUE(again.ok() && again->ready);
  EXPECT_DOUBLE_EQ(again->response.eval_loss(), 1.0);

  const std::vector<v1::EvalEnded> evals = EvalRecords(sim.records());
  ASSERT_EQ(evals.size(), 1u);
  EXPECT_EQ(evals[0].optimizer_update_id(), 2);
  EXPECT_EQ(evals[0].generation(), 1);
  const v1::UpdateRecord& r = sim.machine().updates().back();
  EXPECT_EQ(r.optimizer_update_id(), 2);
  ASSERT_TRUE(r.has_eval_loss());
  EXPECT_DOUBLE_EQ(r.eval_loss(), 1.0);
  EXPECT_EQ(r.eval_valid_tokens(), 40);
  EXPECT_FALSE(sim.machine().updates().front().has_eval_loss());
  EXPECT_EQ(sim.machine().WatchableUpdates(), sim.machine().updates().size());
  EXPECT_DOUBLE_EQ(sim.progress().last_eval_loss(), 1.0);
  EXPECT_EQ(sim.progress().last_eval_update_id(), 2);

  auto begin = sim.Begin(0, 3, 10);  // asked again: the barrier is complete now
  ASSERT_TRUE(begin.ok());
  EXPECT_TRUE(begin->ready);
}

// Catches: a job that ends before its final evaluation, or a final update that is never
// evaluated because it is off the interval.
TEST(StepMachineTest, FinalUpdateIsEvaluatedBeforeTheJobEnds) {
  SpecOptions o = WithEval(2);
  o.max_updates = 3;
  SimulatedRanks sim(ResolvedSpec(o));
  sim.Start(2);
  sim.RunWindow();
  ASSERT_TRUE(sim.RunWindow().run_eval());
  ASSERT_TRUE(sim.Eval(0, 2, 1, 1)->ready == false);
  ASSERT_TRUE(sim.Eval(1, 2, 1, 1)->ready);
  const v1::WindowDecision d3 = sim.RunWindow();
  ASSERT_TRUE(d3.job_done());
  EXPECT_TRUE(d3.run_eval());  // 3 is off the interval, but it is the last update
  EXPECT_EQ(sim.state(), v1::RUNNING);
  ASSERT_FALSE(sim.Eval(0, 3, 4, 2)->ready);
  EXPECT_EQ(sim.state(), v1::RUNNING);
  ASSERT_TRUE(sim.Eval(1, 3, 2, 2)->ready);
  EXPECT_EQ(sim.state(), v1::SUCCEEDED);
  EXPECT_DOUBLE_EQ(sim.progress().last_eval_loss(), 1.5);
  EXPECT_EQ(sim.progress().last_eval_update_id(), 3);
}

// A rank lost during the evaluation: like a window, nothing of it is recorded, the survivors'
// barrier answers ABORTED, and the next generation evaluates the same update again.
// Catches: an eval loss recorded from part of the ranks, a stale generation's report counted,
// and an evaluation that is silently dropped after a failure.
TEST(StepMachineTest, RankLostDuringEvalRecordsNothingAndTheNextGenerationRetries) {
  SimulatedRanks sim(ResolvedSpec(WithEval(1)));
  const std::vector<std::string> g1 = sim.Start(2);
  const std::string standby = sim.AddWorker();
  ASSERT_TRUE(sim.Heartbeat(standby).ok());
  ASSERT_TRUE(sim.RunWindow().run_eval());
  const v1::ReportEvalRequest rank0 = [&] {
    v1::ReportEvalRequest req;
    req.set_job_id(sim.job_id());
    req.set_worker_id(g1[0]);
    req.set_generation(1);
    req.set_rank(0);
    req.set_optimizer_update_id(1);
    req.set_loss_sum(5);
    req.set_valid_units(5);
    return req;
  }();
  ASSERT_FALSE(sim.Eval(rank0)->ready);
  sim.Lose({g1[1]});

  EXPECT_TRUE(EvalRecords(sim.records()).empty());
  EXPECT_EQ(CodeOf(sim.Eval(rank0)), absl::StatusCode::kAborted);
  EXPECT_EQ(sim.generation(), 2);
  absl::StatusOr<v1::HeartbeatResponse> hb = sim.Heartbeat(g1[0]);
  ASSERT_TRUE(hb.ok() && hb->assigned());
  EXPECT_EQ(hb->assignment().pending_eval_update_id(), 1);
  EXPECT_EQ(hb->assignment().next_window_id(), 2);
  EXPECT_FALSE(sim.progress().has_last_eval_loss());

  ASSERT_FALSE(sim.Eval(0, 1, 6, 3)->ready);
  auto done = sim.Eval(1, 1, 2, 1);
  ASSERT_TRUE(done.ok() && done->ready);
  EXPECT_DOUBLE_EQ(done->response.eval_loss(), 2.0);
  const std::vector<v1::EvalEnded> evals = EvalRecords(sim.records());
  ASSERT_EQ(evals.size(), 1u);
  EXPECT_EQ(evals[0].generation(), 2);
  EXPECT_EQ(sim.RunWindow().outcome(), v1::COMMIT);
}

// Catches: a commit whose evaluation a lost rank interrupted, released to watchers without its
// eval_loss because the next window's abort was logged after it (the result came too late).
TEST(StepMachineTest, AbortAfterACommitBeingEvaluatedWaitsForTheEvaluationToo) {
  SimulatedRanks sim(ResolvedSpec(WithEval(2)));
  const std::vector<std::string> g1 = sim.Start(2);
  const std::string standby = sim.AddWorker();
  ASSERT_TRUE(sim.Heartbeat(standby).ok());
  sim.RunWindow();
  ASSERT_TRUE(sim.RunWindow().run_eval());
  // Both ranks begin window 3 (it waits for the evaluation); rank 1 is lost: window 3 aborts.
  ASSERT_FALSE(sim.Begin(0, 3, 10)->ready);
  ASSERT_FALSE(sim.Begin(1, 3, 10)->ready);
  sim.Lose({g1[1]});
  const std::vector<v1::UpdateRecord>& log = sim.machine().updates();
  ASSERT_EQ(log.size(), 3u);
  ASSERT_EQ(OutcomeOf(log[2]), v1::ABORT);
  EXPECT_EQ(sim.machine().WatchableUpdates(), 1u);  // update 2 and the abort after it wait

  ASSERT_EQ(sim.generation(), 2);
  ASSERT_TRUE(sim.Heartbeat(g1[0])->assigned());
  ASSERT_FALSE(sim.Eval(0, 2, 6, 3)->ready);
  ASSERT_TRUE(sim.Eval(1, 2, 2, 1)->ready);
  EXPECT_DOUBLE_EQ(log[1].eval_loss(), 2.0);
  EXPECT_EQ(sim.machine().WatchableUpdates(), 3u);
}

// Catches: evaluations asked for in a job without spec.eval, and reports for an update whose
// evaluation is not due being accepted.
TEST(StepMachineTest, EvalReportsOutsideTheProtocolAreRefused) {
  SimulatedRanks plain(ResolvedSpec({}));
  plain.Start(2);
  EXPECT_FALSE(plain.RunWindow().run_eval());
  EXPECT_EQ(CodeOf(plain.Eval(0, 1, 1, 1)), absl::StatusCode::kFailedPrecondition);

  SimulatedRanks sim(ResolvedSpec(WithEval(2)));
  sim.Start(2);
  sim.RunWindow();
  EXPECT_THAT(MessageOf(sim.Eval(0, 1, 1, 1)), HasSubstr("no evaluation of update 1 is due"));
  sim.RunWindow();
  EXPECT_EQ(CodeOf(sim.Eval(0, 2, 1, -1)), absl::StatusCode::kInvalidArgument);
  ASSERT_FALSE(sim.Eval(0, 2, 1, 1)->ready);
  EXPECT_EQ(CodeOf(sim.Eval(0, 2, 9, 1)), absl::StatusCode::kInvalidArgument);  // changed report
}

// Catches: an evaluation of an update that a rollback erased staying due (it would block the
// job forever, or be recorded against weights that no longer exist).
TEST(StepMachineTest, RollbackPastADueEvalClearsIt) {
  SpecOptions o = WithEval(2);
  o.checkpoint_dir = "/ckpt";
  o.every_updates = 1;
  SimulatedRanks sim(ResolvedSpec(o));
  const std::vector<std::string> g1 = sim.Start(2);
  const v1::WindowDecision d1 = sim.RunWindow();
  ASSERT_TRUE(sim.Ack(d1.checkpoint_id(), 1).ok());
  ASSERT_TRUE(sim.RunWindow().run_eval());  // update 2, checkpoint never acknowledged
  sim.Lose(g1);
  sim.Start(2);
  EXPECT_EQ(sim.progress().optimizer_update_id(), 1);
  absl::StatusOr<v1::HeartbeatResponse> hb = sim.Heartbeat(sim.Ranks()[0]);
  ASSERT_TRUE(hb.ok() && hb->assigned());
  EXPECT_FALSE(hb->assignment().has_pending_eval_update_id());
  const v1::WindowDecision again = sim.RunWindow();  // update 2 again: evaluated again
  EXPECT_EQ(again.optimizer_update_id(), 2);
  EXPECT_TRUE(again.run_eval());
}

// Catches: checkpoint 0 not requested from rank 0 before window 1, or requested from
// every rank (all would write the same directory).
TEST(StepMachineTest, CheckpointZeroPendingForRankZeroOnly) {
  SimulatedRanks sim(ResolvedSpec(WithCheckpoints(10)));
  const std::vector<std::string> ids = sim.Start(2);
  auto hb0 = sim.Heartbeat(ids[0]);
  auto hb1 = sim.Heartbeat(ids[1]);
  ASSERT_TRUE(hb0.ok() && hb1.ok());
  ASSERT_TRUE(hb0->assignment().has_pending_checkpoint_id());
  EXPECT_EQ(hb0->assignment().pending_checkpoint_id(), 0);
  EXPECT_FALSE(hb1->assignment().has_pending_checkpoint_id());
  EXPECT_EQ(sim.progress().durable_checkpoint_id(), -1);
  ASSERT_TRUE(sim.Ack(0, 0).ok());
  EXPECT_EQ(sim.progress().durable_checkpoint_id(), 0);
}

// Catches: an ack that is not idempotent, journals twice, or accepts a checkpoint of the
// wrong update, an unknown checkpoint, or a job without checkpoints.
TEST(StepMachineTest, AckCheckpoint) {
  SimulatedRanks sim(ResolvedSpec(WithCheckpoints(1)));
  sim.Start(2);
  const v1::WindowDecision d = sim.RunWindow();
  ASSERT_TRUE(d.write_checkpoint());
  ASSERT_EQ(d.checkpoint_id(), 1);
  EXPECT_EQ(CodeOf(sim.Ack(1, 2)), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CodeOf(sim.Ack(7, 1)), absl::StatusCode::kNotFound);
  EXPECT_EQ(CodeOf(sim.Ack(1, 1, "w-999")), absl::StatusCode::kNotFound);
  EXPECT_EQ(sim.progress().durable_checkpoint_id(), -1);
  const size_t before = sim.records().size();
  ASSERT_TRUE(sim.Ack(1, 1).ok());
  EXPECT_EQ(sim.records().size(), before + 1);
  ASSERT_TRUE(sim.records().back().has_checkpoint_durable());
  EXPECT_EQ(sim.records().back().checkpoint_durable().path(), "/ckpt/ckpt-1");
  EXPECT_EQ(sim.progress().durable_checkpoint_id(), 1);
  ASSERT_TRUE(sim.Ack(1, 1).ok());
  EXPECT_EQ(sim.records().size(), before + 1);  // idempotent

  SimulatedRanks off(ResolvedSpec({}));
  off.Start(2);
  off.RunWindow();
  EXPECT_EQ(CodeOf(off.Ack(0, 0)), absl::StatusCode::kFailedPrecondition);
}

// Catches a checkpoint rank 0 could not write (a full disk) taken as durable (a rollback would
// look for files that are not there), failing the job, or going unseen; and its later retry
// refused. The job ends once the final checkpoint is written after all.
TEST(StepMachineTest, AFailedCheckpointIsCountedNotDurableAndItsRetryCounts) {
  SimulatedRanks sim(ResolvedSpec(MaxUpdatesWithCheckpoints(1)));
  sim.Start(2);
  const v1::WindowDecision last = sim.RunWindow();
  ASSERT_TRUE(last.job_done() && last.write_checkpoint());
  const size_t before = sim.records().size();
  ASSERT_TRUE(sim.Ack(1, 1, "", "write /ckpt/.ckpt-1.tmp/model.safetensors: No space left").ok());
  EXPECT_EQ(sim.records().size(), before);  // nothing journaled
  EXPECT_EQ(sim.progress().durable_checkpoint_id(), -1);
  EXPECT_EQ(sim.progress().checkpoint_failures(), 1);
  EXPECT_NE(sim.progress().last_checkpoint_failure().find("No space left"), std::string::npos);
  EXPECT_EQ(sim.state(), v1::RUNNING);  // its end waits for the final checkpoint
  ASSERT_TRUE(sim.Ack(1, 1).ok());      // written again
  EXPECT_EQ(sim.progress().durable_checkpoint_id(), 1);
  EXPECT_EQ(sim.state(), v1::SUCCEEDED);
}

// Catches: a job that ends before its final checkpoint is durable, or never ends.
TEST(StepMachineTest, MaxUpdatesEndsAfterFinalCheckpointAck) {
  SimulatedRanks sim(ResolvedSpec(MaxUpdatesWithCheckpoints(2)));
  sim.Start(2);
  EXPECT_FALSE(sim.RunWindow().job_done());
  const v1::WindowDecision last = sim.RunWindow();
  EXPECT_TRUE(last.job_done());
  ASSERT_TRUE(last.write_checkpoint());  // the final update is always checkpointed
  EXPECT_EQ(last.checkpoint_id(), 1);
  EXPECT_EQ(sim.state(), v1::RUNNING);
  EXPECT_EQ(CodeOf(sim.Begin(0, 3, 10)), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(sim.Ack(1, 2).ok());
  EXPECT_EQ(sim.state(), v1::SUCCEEDED);
  EXPECT_EQ(sim.job().end_time_ms(), absl::ToUnixMillis(sim.now()));
  EXPECT_EQ(sim.progress().max_updates(), 2);
  EXPECT_FALSE(sim.machine().NextDeadline().has_value());
}

// Catches: a job without checkpoints that waits for an ack that never comes.
TEST(StepMachineTest, MaxUpdatesWithoutCheckpointsEndsAtOnce) {
  SpecOptions o;
  o.max_updates = 2;
  SimulatedRanks sim(ResolvedSpec(o));
  sim.Start(2);
  RankReport inf;
  inf.found_inf = true;
  sim.RunWindow();
  EXPECT_EQ(sim.RunWindow(Reports(2, inf)).reason(), "OVERFLOW");  // skips do not count
  EXPECT_EQ(sim.state(), v1::RUNNING);
  const v1::WindowDecision last = sim.RunWindow();
  EXPECT_TRUE(last.job_done());
  EXPECT_FALSE(last.write_checkpoint());
  EXPECT_EQ(sim.state(), v1::SUCCEEDED);
  EXPECT_EQ(sim.progress().optimizer_update_id(), 2);
  EXPECT_EQ(sim.progress().window_id(), 3);
}

// Catches: stop.epochs counted in updates instead of windows, or a wrong epoch index.
TEST(StepMachineTest, EpochsEndTheJob) {
  SpecOptions o;
  o.epochs = 2;
  SimulatedRanks sim(ResolvedSpec(o));
  sim.set_samples(10);  // 3 windows an epoch (tail dynamic)
  sim.Start(2);
  std::vector<int64_t> epochs;
  RankReport inf;
  inf.found_inf = true;
  for (int i = 0; i < 6; ++i) {
    ASSERT_EQ(sim.state(), v1::RUNNING) << i;
    const v1::WindowDecision d = sim.RunWindow(i == 2 ? Reports(2, inf) : Reports(2));
    epochs.push_back(d.record().epoch());
    EXPECT_EQ(d.job_done(), i == 5);
  }
  EXPECT_THAT(epochs, ElementsAre(0, 0, 0, 1, 1, 1));
  EXPECT_EQ(sim.state(), v1::SUCCEEDED);
  EXPECT_EQ(sim.progress().window_id(), 6);
  EXPECT_EQ(sim.progress().optimizer_update_id(), 5);
}

// Catches: a job whose last window is a skip ending without a checkpoint of its last
// commit (the final weights would be lost).
TEST(StepMachineTest, FinalCheckpointAssignedWhenLastWindowSkips) {
  SpecOptions o = WithCheckpoints(100);
  o.epochs = 1;
  SimulatedRanks sim(ResolvedSpec(o));
  sim.set_samples(12);  // 3 windows
  sim.Start(2);
  sim.RunWindow();
  sim.RunWindow();
  RankReport inf;
  inf.found_inf = true;
  const v1::WindowDecision last = sim.RunWindow(Reports(2, inf));
  EXPECT_EQ(last.outcome(), v1::SKIP);
  EXPECT_TRUE(last.job_done());
  ASSERT_TRUE(last.write_checkpoint());
  EXPECT_EQ(last.checkpoint_id(), 1);
  EXPECT_EQ(sim.state(), v1::RUNNING);
  EXPECT_EQ(CodeOf(sim.Ack(1, 1)), absl::StatusCode::kInvalidArgument);  // it holds update 2
  ASSERT_TRUE(sim.Ack(1, 2).ok());
  EXPECT_EQ(sim.state(), v1::SUCCEEDED);
}

// Catches: a second, redundant final checkpoint when the last commit was already
// checkpointed, or a job that ends before that checkpoint is durable.
TEST(StepMachineTest, NoExtraFinalCheckpointWhenLastCommitWasCheckpointed) {
  SpecOptions o = WithCheckpoints(2);
  o.epochs = 1;
  SimulatedRanks sim(ResolvedSpec(o));
  sim.set_samples(12);
  sim.Start(2);
  sim.RunWindow();
  ASSERT_TRUE(sim.RunWindow().write_checkpoint());
  RankReport inf;
  inf.found_inf = true;
  const v1::WindowDecision last = sim.RunWindow(Reports(2, inf));
  EXPECT_TRUE(last.job_done());
  EXPECT_FALSE(last.write_checkpoint());
  EXPECT_EQ(sim.state(), v1::RUNNING);  // checkpoint 1 is not durable yet
  ASSERT_TRUE(sim.Ack(1, 2).ok());
  EXPECT_EQ(sim.state(), v1::SUCCEEDED);
}

// Catches: the final checkpoint forgotten when its writer (rank 0) dies before acking it:
// the next generation's rank 0 must write it, and the job ends only after that ack.
TEST(StepMachineTest, FinalCheckpointReassignedWhenWriterDies) {
  SimulatedRanks sim(ResolvedSpec(MaxUpdatesWithCheckpoints(1)));
  const std::vector<std::string> g1 = sim.Start(2);
  const v1::WindowDecision last = sim.RunWindow();
  ASSERT_TRUE(last.write_checkpoint());
  ASSERT_TRUE(last.job_done());
  sim.Lose({g1[0]});
  EXPECT_EQ(sim.state(), v1::RUNNING);
  const std::string standby = sim.AddWorker();
  ASSERT_TRUE(sim.Heartbeat(standby).ok());
  EXPECT_THAT(sim.Ranks(), ElementsAre(g1[1], standby));
  auto hb0 = sim.Heartbeat(g1[1]);
  auto hb1 = sim.Heartbeat(standby);
  ASSERT_TRUE(hb0.ok() && hb1.ok());
  ASSERT_TRUE(hb0->assigned());
  EXPECT_EQ(hb0->assignment().state_source(), v1::Assignment::BROADCAST);
  ASSERT_TRUE(hb0->assignment().has_pending_checkpoint_id());
  EXPECT_EQ(hb0->assignment().pending_checkpoint_id(), last.checkpoint_id());
  EXPECT_FALSE(hb1->assignment().has_pending_checkpoint_id());
  EXPECT_EQ(sim.state(), v1::RUNNING);
  ASSERT_TRUE(sim.Ack(last.checkpoint_id(), 1, g1[1]).ok());
  EXPECT_EQ(sim.state(), v1::SUCCEEDED);
}

}  // namespace
}  // namespace trainstep
