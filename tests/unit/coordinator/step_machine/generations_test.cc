// StepMachine tests: Generations and membership (coordinator/step_machine/generations.cc).
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "coordinator/step_machine.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/coordinator/step_machine/step_machine_test_util.h"

namespace trainstep {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing_util::Checksummed;
using testing_util::CodeOf;
using testing_util::Elastic;
using testing_util::FormedWith;
using testing_util::Fp16;
using testing_util::MessageOf;
using testing_util::RankReport;
using testing_util::Reports;
using testing_util::ResolvedSpec;
using testing_util::ShrunkToOneInWindow2;
using testing_util::SimulatedRanks;
using testing_util::SpecOptions;
using testing_util::Validated;
using testing_util::WithCheckpoints;

// Catches: a lost rank that does not abort the window in flight, a new generation that
// drops survivors or misorders them, a wrong state source, or a retry under another
// window id.
TEST(StepMachineTest, LeaseExpiryAbortsWindowAndRetriesInNewGeneration) {
  SpecOptions o;
  o.workers = 3;
  SimulatedRanks sim(ResolvedSpec(o));
  const std::vector<std::string> g1 = sim.Start(3);
  const std::string standby = sim.AddWorker();
  ASSERT_TRUE(sim.Heartbeat(standby).ok());
  ASSERT_EQ(sim.RunWindow(Reports(3)).outcome(), v1::COMMIT);

  sim.BeginAll(2, {10, 10, 10});
  ASSERT_FALSE(sim.Complete(1, 2, RankReport{})->ready);
  const v1::CompleteWindowRequest rank1_report = sim.CompleteRequest(1, 2, RankReport{});
  EXPECT_EQ(sim.machine().NextDeadline(), sim.now() + absl::Seconds(10));
  const size_t before = sim.records().size();
  sim.Lose({g1[0]});  // rank 0 dies mid-window

  // The records: the abort, the loss, the new generation, in that order.
  std::vector<v1::JournalRecord> fresh(sim.records().begin() + before, sim.records().end());
  ASSERT_EQ(fresh.size(), 3u);
  ASSERT_TRUE(fresh[0].has_window_ended());
  const v1::WindowDecision& abort = fresh[0].window_ended().decision();
  EXPECT_EQ(abort.outcome(), v1::ABORT);
  EXPECT_EQ(abort.reason(), "WORKER_LOST");
  EXPECT_EQ(abort.record().window_id(), 2);
  EXPECT_EQ(abort.record().generation(), 1);
  EXPECT_EQ(abort.record().global_valid_tokens(), 30);
  EXPECT_EQ(abort.optimizer_update_id(), 1);
  ASSERT_TRUE(fresh[1].has_worker_lost());
  EXPECT_EQ(fresh[1].worker_lost().worker_id(), g1[0]);
  ASSERT_TRUE(fresh[2].has_generation_formed());
  const v1::GenerationFormed& f = fresh[2].generation_formed();
  EXPECT_EQ(f.generation(), 2);
  EXPECT_THAT(f.worker_ids(), ElementsAre(g1[1], g1[2], standby));  // survivors first
  EXPECT_EQ(f.assignment().state_source(), v1::Assignment::BROADCAST);
  EXPECT_EQ(f.assignment().source_rank(), 0);
  EXPECT_EQ(f.assignment().next_window_id(), 2);
  EXPECT_EQ(f.assignment().optimizer_update_id(), 1);
  EXPECT_EQ(f.assignment().scheduler_step(), 1);
  EXPECT_FALSE(f.rolled_back());

  // The survivor that had reported learns of the abort by asking again.
  auto again = sim.Complete(rank1_report);
  ASSERT_TRUE(again.ok());
  ASSERT_TRUE(again->ready);
  EXPECT_EQ(again->response.decision().outcome(), v1::ABORT);
  // The lost worker is fenced off: NOT_FOUND tells it to register again (a new identity).
  EXPECT_EQ(CodeOf(sim.Heartbeat(g1[0])), absl::StatusCode::kNotFound);
  EXPECT_THAT(MessageOf(sim.Heartbeat(g1[0])), HasSubstr("declared lost"));

  const v1::JobProgress p = sim.progress();
  EXPECT_EQ(p.window_id(), 1);
  EXPECT_EQ(p.optimizer_update_id(), 1);
  EXPECT_EQ(p.windows_aborted(), 1);
  const v1::WindowDecision retry = sim.RunWindow(Reports(3));
  EXPECT_EQ(retry.outcome(), v1::COMMIT);
  EXPECT_EQ(retry.record().window_id(), 2);
  EXPECT_EQ(retry.record().generation(), 2);
  EXPECT_EQ(retry.optimizer_update_id(), 2);
}

// Catches: a generation formed with fewer workers than workers.count, a lost worker with
// no window in flight that leaves an ABORT record, or a job that never resumes when a
// replacement joins.
TEST(StepMachineTest, LostWorkerWithoutStandbyWaitsForReplacement) {
  SimulatedRanks sim(ResolvedSpec({}));
  const std::vector<std::string> g1 = sim.Start(2);
  ASSERT_EQ(sim.RunWindow().outcome(), v1::COMMIT);
  sim.Lose({g1[1]});
  EXPECT_EQ(sim.progress().windows_aborted(), 0);  // nothing was in flight
  EXPECT_EQ(sim.generation(), 1);
  EXPECT_EQ(sim.state(), v1::RUNNING);
  EXPECT_EQ(CodeOf(sim.Begin(0, 2, 10)), absl::StatusCode::kAborted);  // generation 1 is over
  auto hb = sim.Heartbeat(g1[0]);
  ASSERT_TRUE(hb.ok());
  EXPECT_FALSE(hb->assigned());

  const std::string fresh = sim.AddWorker();
  ASSERT_TRUE(sim.Heartbeat(fresh).ok());
  EXPECT_EQ(sim.generation(), 2);
  EXPECT_THAT(sim.Ranks(), ElementsAre(g1[0], fresh));
  hb = sim.Heartbeat(fresh);
  ASSERT_TRUE(hb->assigned());
  EXPECT_EQ(hb->assignment().state_source(), v1::Assignment::BROADCAST);
  EXPECT_EQ(hb->assignment().next_window_id(), 2);
  EXPECT_EQ(sim.RunWindow().record().window_id(), 2);
}

// Catches: all replicas lost after updates without a rollback to the latest durable
// checkpoint (ids, tokens and scale must return to that checkpoint's).
TEST(StepMachineTest, AllLostRollsBackToDurableCheckpoint) {
  SimulatedRanks sim(ResolvedSpec(WithCheckpoints(2, Fp16(1024, 3))));
  const std::vector<std::string> g1 = sim.Start(2);
  ASSERT_TRUE(sim.RunWindow().write_checkpoint() == false);
  const v1::WindowDecision d2 = sim.RunWindow();
  ASSERT_TRUE(d2.write_checkpoint());
  ASSERT_TRUE(sim.Ack(d2.checkpoint_id(), 2).ok());
  const double scale_at_ckpt = sim.progress().loss_scale();
  RankReport inf;
  inf.found_inf = true;
  sim.RunWindow(Reports(2, inf));                 // window 3: skip, scale backs off
  sim.RunWindow();                                // window 4: update 3
  const v1::WindowDecision d5 = sim.RunWindow();  // update 4: checkpoint 2, never acked
  ASSERT_TRUE(d5.write_checkpoint());
  ASSERT_EQ(sim.progress().optimizer_update_id(), 4);
  ASSERT_NE(sim.progress().loss_scale(), scale_at_ckpt);

  sim.Lose(g1);
  EXPECT_EQ(sim.state(), v1::RUNNING);
  EXPECT_EQ(sim.progress().optimizer_update_id(), 4);  // not rolled back until a generation forms
  const size_t before = sim.records().size();
  const std::vector<std::string> g2 = sim.Start(2);
  const v1::GenerationFormed* f = nullptr;
  for (size_t i = before; i < sim.records().size(); ++i) {
    if (sim.records()[i].has_generation_formed()) f = &sim.records()[i].generation_formed();
  }
  ASSERT_NE(f, nullptr);
  EXPECT_TRUE(f->rolled_back());
  EXPECT_EQ(f->rollback_to().checkpoint_id(), d2.checkpoint_id());
  EXPECT_EQ(f->assignment().state_source(), v1::Assignment::CHECKPOINT);
  EXPECT_EQ(f->assignment().checkpoint_id(), d2.checkpoint_id());
  EXPECT_EQ(f->assignment().optimizer_update_id(), 2);
  EXPECT_EQ(f->assignment().scheduler_step(), 2);
  EXPECT_EQ(f->assignment().next_window_id(), 3);
  EXPECT_FALSE(f->assignment().has_pending_checkpoint_id());  // checkpoint 1 is durable

  const v1::JobProgress p = sim.progress();
  EXPECT_EQ(p.generation(), 2);
  EXPECT_EQ(p.rollbacks(), 1);  // counted for `job get` and the chaos tool's judgement
  EXPECT_EQ(p.window_id(), 2);
  EXPECT_EQ(p.optimizer_update_id(), 2);
  EXPECT_EQ(p.scheduler_step(), 2);
  EXPECT_EQ(p.cumulative_tokens(), 40);
  EXPECT_EQ(p.checkpoint_id(), d2.checkpoint_id());
  EXPECT_EQ(p.durable_checkpoint_id(), d2.checkpoint_id());
  EXPECT_EQ(p.loss_scale(), scale_at_ckpt);
  // Checkpoint 2 of the lost state can never be acknowledged.
  EXPECT_EQ(CodeOf(sim.Ack(d5.checkpoint_id(), 4, g2[0])), absl::StatusCode::kNotFound);

  const v1::WindowDecision next = sim.RunWindow();
  EXPECT_EQ(next.record().window_id(), 3);
  EXPECT_EQ(next.optimizer_update_id(), 3);
  const v1::WindowDecision ck = sim.RunWindow();
  ASSERT_TRUE(ck.write_checkpoint());
  EXPECT_GT(ck.checkpoint_id(), d5.checkpoint_id());  // checkpoint ids are never reused
}

// Catches: a checkpoint found damaged when a rolled-back generation loads it failing the job,
// or being loaded again, instead of the job rolling back past it to the one before; a second
// rank's report of it ending the next generation too; the damage lost across a restart.
TEST(StepMachineTest, ACheckpointFoundDamagedAtLoadIsRolledBackPast) {
  SimulatedRanks sim(ResolvedSpec(WithCheckpoints(2, Fp16(1024, 3))));
  const std::vector<std::string> g1 = sim.Start(2);
  sim.RunWindow();
  const v1::WindowDecision d2 = sim.RunWindow();
  ASSERT_TRUE(sim.Ack(d2.checkpoint_id(), 2).ok());
  sim.RunWindow();
  const v1::WindowDecision d4 = sim.RunWindow();
  ASSERT_TRUE(d4.write_checkpoint());
  ASSERT_TRUE(sim.Ack(d4.checkpoint_id(), 4).ok());
  sim.RunWindow();
  sim.Lose(g1);
  const std::vector<std::string> g2 = sim.Start(2);
  ASSERT_EQ(sim.progress().optimizer_update_id(), 4);  // rolled back to the later checkpoint
  const int64_t generation = sim.generation();

  v1::ReportFailureRequest report;
  report.set_job_id(sim.job_id());
  report.set_worker_id(g2[1]);
  report.set_message("ckpt-2/model.safetensors is corrupt");
  report.set_damaged_checkpoint_id(d4.checkpoint_id());
  const size_t before = sim.records().size();
  ASSERT_TRUE(sim.machine().ReportFailure(report, sim.now()).ok());
  sim.Drain();
  EXPECT_EQ(sim.state(), v1::RUNNING);
  ASSERT_TRUE(sim.records().back().has_generation_ended());
  EXPECT_THAT(sim.records().back().generation_ended().reason(),
              HasSubstr("is damaged: ckpt-2/model.safetensors is corrupt"));
  EXPECT_EQ(sim.progress().durable_checkpoint_id(), d2.checkpoint_id());
  report.set_worker_id(g2[0]);  // the other rank found it too, after the generation ended
  EXPECT_EQ(CodeOf(sim.machine().ReportFailure(report, sim.now())),
            absl::StatusCode::kFailedPrecondition);
  report.set_damaged_checkpoint_id(d2.checkpoint_id());  // not what any generation loads
  EXPECT_EQ(CodeOf(sim.machine().ReportFailure(report, sim.now())),
            absl::StatusCode::kFailedPrecondition);

  // A restart keeps the mark: the next generation must not load the damaged one again.
  sim.registry().Restore(sim.registry().Snapshot(), sim.now());
  for (const std::string& id : g2) ASSERT_TRUE(sim.HeartbeatAs(id, 0, generation).ok());
  sim.Tick();
  const std::vector<v1::GenerationFormed> formed = sim.FormedSince(before);
  ASSERT_EQ(formed.size(), 1u);
  EXPECT_TRUE(formed[0].rolled_back());
  EXPECT_EQ(formed[0].assignment().state_source(), v1::Assignment::CHECKPOINT);
  EXPECT_EQ(formed[0].assignment().checkpoint_id(), d2.checkpoint_id());
  EXPECT_EQ(formed[0].assignment().optimizer_update_id(), 2);
  EXPECT_EQ(sim.progress().rollbacks(), 2);
  EXPECT_EQ(sim.RunWindow().optimizer_update_id(), 3);
}

// A process outlives its rank (fenced as hung, or paused past its lease) and rejoins under a new
// id with its replica where it stopped; a rollback then discards that state, and the checkpoint
// it rolls back to turns out damaged. Catches: the coordinator taking that replica, ahead of the
// rolled-back job, for one that holds the job's update (applied ≥ current), and seeding the next
// generation from it: the job then trains on from the wrong weights (a mixed chaos campaign's
// final weights differed from the fault-free run after a hang and a damaged checkpoint).
TEST(StepMachineTest, AReplicaThatARollbackLeftBehindNeverSeedsTheJob) {
  SimulatedRanks sim(ResolvedSpec(WithCheckpoints(2, Fp16(1024, 3))));
  const std::vector<std::string> g1 = sim.Start(2);
  sim.RunWindow();
  const v1::WindowDecision d2 = sim.RunWindow();
  ASSERT_TRUE(sim.Ack(d2.checkpoint_id(), 2).ok());
  sim.RunWindow();
  const v1::WindowDecision d4 = sim.RunWindow();
  ASSERT_TRUE(sim.Ack(d4.checkpoint_id(), 4).ok());
  ASSERT_EQ(sim.RunWindow().optimizer_update_id(), 5);
  // Rank 0's process, its replica at update 5, rejoins under a new id; a fresh worker joins.
  const std::string left_behind = sim.AddWorker();
  ASSERT_TRUE(sim.HeartbeatAs(left_behind, 5, /*idle_after=*/sim.generation()).ok());
  const std::string fresh = sim.AddWorker();
  ASSERT_TRUE(sim.HeartbeatAs(fresh, 0, /*idle_after=*/0).ok());
  sim.Lose(g1);  // no rank of the job's generation is left: roll back to update 4
  ASSERT_EQ(sim.progress().optimizer_update_id(), 4);
  const int64_t generation = sim.generation();
  const size_t before = sim.records().size();

  // Its load of checkpoint 2 fails: the left-behind replica is still at update 5.
  v1::ReportFailureRequest report;
  report.set_job_id(sim.job_id());
  report.set_worker_id(left_behind);
  report.set_message("ckpt-2/model.safetensors is corrupt");
  report.set_damaged_checkpoint_id(d4.checkpoint_id());
  ASSERT_TRUE(sim.machine().ReportFailure(report, sim.now()).ok());
  sim.Drain();
  ASSERT_TRUE(sim.HeartbeatAs(left_behind, 5, generation).ok());
  ASSERT_TRUE(sim.HeartbeatAs(fresh, 0, generation).ok());
  sim.Tick();
  const std::vector<v1::GenerationFormed> formed = sim.FormedSince(before);
  ASSERT_EQ(formed.size(), 1u);
  EXPECT_TRUE(formed[0].rolled_back());
  EXPECT_EQ(formed[0].assignment().state_source(), v1::Assignment::CHECKPOINT);
  EXPECT_EQ(formed[0].assignment().checkpoint_id(), d2.checkpoint_id());
  EXPECT_EQ(formed[0].assignment().optimizer_update_id(), 2);
}

// The rule: while a replica that holds the current update may be alive, the job never
// rolls back — also right after a coordinator restart, when nobody has said yet what it holds.
// Catches: a restarted coordinator rolling back to the last durable checkpoint because a worker
// was lost before the survivors (busy applying the decision they got from the re-sent report)
// reported the update they hold — the outside probe saw 6 such rollbacks redo 35 updates.
TEST(StepMachineTest, RestartedCoordinatorDoesNotRollBackWhileSurvivorsMayHoldTheUpdate) {
  SpecOptions three = WithCheckpoints(2, Fp16(1024, 3));
  three.workers = 3;
  SimulatedRanks job(ResolvedSpec(three));
  const std::vector<std::string> ids = job.Start(4);  // three ranks and a spare
  ASSERT_EQ(job.Ranks().size(), 3u);
  job.RunWindow();
  const v1::WindowDecision d2 = job.RunWindow();
  ASSERT_TRUE(d2.write_checkpoint());
  ASSERT_TRUE(job.Ack(d2.checkpoint_id(), 2).ok());
  ASSERT_EQ(job.RunWindow().optimizer_update_id(), 3);
  const std::vector<std::string> ranks = job.Ranks();
  std::string spare;
  for (const std::string& id : ids) {
    if (std::find(ranks.begin(), ranks.end(), id) == ranks.end()) spare = id;
  }

  // The coordinator restarts; ranks 1 and 2 speak first with what they held before the
  // decision of update 3 reached them, and rank 0 never comes back.
  job.registry().Restore(job.registry().Snapshot(), job.now());
  job.registry().Recovered(job.now());
  const size_t before = job.records().size();
  for (int i = 0; i < 2; ++i) {
    job.Advance(job.options().reconnect_grace / 2);
    for (const std::string& id : {ranks[1], ranks[2]}) ASSERT_TRUE(job.HeartbeatAs(id, 2).ok());
    ASSERT_TRUE(job.HeartbeatAs(spare, 0, /*idle_after=*/0).ok());
    job.Tick();
  }
  ASSERT_EQ(job.machine().Workers()[0].state(), v1::LOST);  // rank 0 never reconnected
  EXPECT_TRUE(job.FormedSince(before).empty()) << "formed a generation before the survivors spoke";
  EXPECT_EQ(job.progress().optimizer_update_id(), 3);

  // Rank 1 has applied update 3 and waits for the next generation: it seeds it.
  ASSERT_TRUE(job.HeartbeatAs(ranks[1], 3, /*idle_after=*/1).ok());
  const std::vector<v1::GenerationFormed> formed = job.FormedSince(before);
  ASSERT_EQ(formed.size(), 1u);
  EXPECT_FALSE(formed[0].rolled_back());
  EXPECT_EQ(formed[0].assignment().state_source(), v1::Assignment::BROADCAST);
  EXPECT_EQ(formed[0].worker_ids(0), ranks[1]);
  EXPECT_EQ(formed[0].assignment().optimizer_update_id(), 3);
  EXPECT_EQ(job.progress().rollbacks(), 0);
  EXPECT_EQ(job.RunWindow().optimizer_update_id(), 4);
}

// Catches: a rank that gave its generation up (its collective failed) while the coordinator
// still counts it: the others wait at the barrier for it for ever. Its idle heartbeat ends the
// generation at once — with an ABORT when a window was in flight — and the next one forms.
TEST(StepMachineTest, ARankWaitingForALaterGenerationEndsTheCurrentOne) {
  SimulatedRanks sim(ResolvedSpec({}));
  sim.Start(2);
  ASSERT_EQ(sim.RunWindow().outcome(), v1::COMMIT);
  const std::vector<std::string> g1 = sim.Ranks();
  ASSERT_FALSE(sim.Begin(0, 2, 10)->ready);
  size_t before = sim.records().size();
  ASSERT_TRUE(sim.HeartbeatAs(g1[1], 1, /*idle_after=*/1).ok());
  ASSERT_EQ(sim.machine().updates().back().outcome(), "abort");
  EXPECT_EQ(sim.machine().updates().back().reason(), "WORKER_LOST");
  // Both replicas hold update 1 and are alive: the same two form generation 2 (rank 0 once it
  // too says it is idle, or at once — it holds the update).
  std::vector<v1::GenerationFormed> formed = sim.FormedSince(before);
  ASSERT_EQ(formed.size(), 1u);
  EXPECT_EQ(formed[0].generation(), 2);
  EXPECT_FALSE(formed[0].rolled_back());
  EXPECT_EQ(sim.RunWindow().optimizer_update_id(), 2);

  // Between windows (nothing in flight) the generation ends through its own record.
  before = sim.records().size();
  ASSERT_TRUE(sim.HeartbeatAs(sim.Ranks()[0], 2, /*idle_after=*/2).ok());
  bool left = false;
  for (size_t i = before; i < sim.records().size(); ++i) {
    left |= sim.records()[i].has_generation_ended();
  }
  EXPECT_TRUE(left);
  EXPECT_EQ(sim.generation(), 3);
  // A stale idle heartbeat from before generation 3 ends nothing.
  before = sim.records().size();
  ASSERT_TRUE(sim.HeartbeatAs(sim.Ranks()[1], 2, /*idle_after=*/2).ok());
  EXPECT_EQ(sim.generation(), 3);
  EXPECT_TRUE(sim.FormedSince(before).empty());
}

// Catches the churn seen with real processes: a rank's collective fails the moment its peer
// dies, it gives the generation up, and the next generation was formed at once with the dead
// peer (its stream had dropped, its grace not yet run out) — and broke again 300 ms later.
TEST(StepMachineTest, ANewGenerationIsNotBuiltOnADetachedWorker) {
  SimulatedRanks sim(ResolvedSpec({}));
  sim.Start(3);  // two ranks and a spare
  ASSERT_EQ(sim.RunWindow().outcome(), v1::COMMIT);
  const std::vector<std::string> g1 = sim.Ranks();
  v1::AttachRequest req;
  req.set_job_id(sim.job_id());
  req.set_worker_id(g1[1]);
  ASSERT_TRUE(sim.machine().Attach(req, 7, sim.now()).ok());
  sim.machine().Detached(g1[1], 7, sim.now());  // its process died
  const size_t before = sim.records().size();
  ASSERT_TRUE(sim.HeartbeatAs(g1[0], 1, /*idle_after=*/1).ok());  // its all-reduce failed
  const std::vector<v1::GenerationFormed> formed = sim.FormedSince(before);
  ASSERT_EQ(formed.size(), 1u);
  EXPECT_EQ(formed[0].worker_ids(0), g1[0]);
  EXPECT_NE(formed[0].worker_ids(1), g1[1]);  // the spare, not the detached worker
  EXPECT_FALSE(formed[0].rolled_back());
}

// Catches: a job of workers.count 3 that loses a worker for good idling for the join grace
// (30 s by default) although training at two ranks gives the same weights.
TEST(StepMachineTest, ALostRankShrinksTheJobAtOnce) {
  SimulatedRanks sim(ResolvedSpec(Elastic(3, 2, "5s")));
  const std::vector<std::string> g1 = sim.Start(3);
  ASSERT_EQ(sim.RunWindow().optimizer_update_id(), 1);
  const size_t before = sim.records().size();
  sim.Lose({g1[2]});
  const std::vector<v1::GenerationFormed> formed = FormedWith(sim, before, 2);
  ASSERT_EQ(formed.size(), 1u);  // no grace: formed on the tick that lost the rank
  EXPECT_FALSE(formed[0].rolled_back());
  EXPECT_EQ(formed[0].assignment().state_source(), v1::Assignment::BROADCAST);
  EXPECT_TRUE(sim.progress().waiting().empty());
  const v1::WindowDecision d = sim.RunWindow();
  EXPECT_EQ(d.outcome(), v1::COMMIT);
  EXPECT_EQ(d.record().world_size(), 2);  // the log shows the change
  EXPECT_EQ(d.optimizer_update_id(), 2);
}

// Catches: the first generation starting with whoever came first (workers start at different
// times) instead of giving the rest the join grace; and a driver spinning on the passed grace.
TEST(StepMachineTest, TheFirstGenerationWaitsTheJoinGraceForWorkersCount) {
  SimulatedRanks sim(ResolvedSpec(Elastic(3, 2, "5s")));
  sim.Start(2);
  EXPECT_TRUE(sim.FormedSince(0).empty());  // the grace runs
  EXPECT_EQ(sim.progress().workers_available(), 2);
  EXPECT_NE(sim.progress().waiting().find("waiting for 1 more worker"), std::string::npos)
      << sim.progress().waiting();
  const absl::Time grace_end = sim.now() + absl::Seconds(5);
  ASSERT_TRUE(sim.machine().NextDeadline().has_value());
  EXPECT_LE(*sim.machine().NextDeadline(), grace_end);
  sim.Advance(absl::Seconds(5) - absl::Milliseconds(1));
  sim.HeartbeatAllExcept({});
  sim.Tick();
  EXPECT_TRUE(sim.FormedSince(0).empty());
  sim.Advance(absl::Milliseconds(1));
  sim.Tick();
  ASSERT_EQ(FormedWith(sim, 0, 2).size(), 1u);
  EXPECT_TRUE(sim.progress().waiting().empty());
  EXPECT_EQ(sim.RunWindow().record().world_size(), 2);
  // The grace is not a time the driver must keep waking for once it passed.
  const std::optional<absl::Time> next = sim.machine().NextDeadline();
  ASSERT_TRUE(next.has_value());
  EXPECT_GT(*next, sim.now());
}

// Catches: two ranks that die together re-forming the job twice (once without the first, then
// again without the second): a survivor whose stream dropped is waited for until its lease
// ends, and the wait is visible.
TEST(StepMachineTest, ASurvivorWhoseStreamDroppedIsWaitedForUntilItsLeaseEnds) {
  SimulatedRanks sim(ResolvedSpec(Elastic(4, 2, "5s")));
  const std::vector<std::string> g1 = sim.Start(4);
  sim.RunWindow();
  v1::AttachRequest req;
  req.set_job_id(sim.job_id());
  req.set_worker_id(g1[3]);
  ASSERT_TRUE(sim.machine().Attach(req, 7, sim.now()).ok());
  const size_t before = sim.records().size();
  const absl::Duration lease = sim.options().worker_lease;
  sim.Advance(lease / 2);
  sim.HeartbeatAllExcept({g1[2]});
  sim.Advance(lease / 2 - absl::Milliseconds(100));
  sim.machine().Detached(g1[3], 7, sim.now());  // it dies too: its lease ends in 300 ms
  sim.Advance(absl::Milliseconds(101));
  sim.Tick();  // g1[2]'s lease ended
  EXPECT_TRUE(sim.FormedSince(before).empty());
  EXPECT_NE(sim.progress().waiting().find("1 worker(s) whose connection dropped"),
            std::string::npos)
      << sim.progress().waiting();
  ASSERT_TRUE(sim.machine().NextDeadline().has_value());
  sim.Advance(*sim.machine().NextDeadline() - sim.now());
  sim.Tick();
  const std::vector<v1::GenerationFormed> formed = sim.FormedSince(before);
  ASSERT_EQ(formed.size(), 1u);
  EXPECT_EQ(formed[0].worker_ids_size(), 2);
  EXPECT_EQ(sim.RunWindow().record().world_size(), 2);
}

// Catches: a job below workers.min training anyway, rolling back, or waiting silently; and a
// driver spinning on a past grace deadline meanwhile.
TEST(StepMachineTest, BelowMinWaitsVisiblyWithoutRollingBack) {
  SimulatedRanks sim(ResolvedSpec(Elastic(3, 2, "1s")));
  const std::vector<std::string> g1 = sim.Start(3);
  sim.RunWindow();
  sim.RunWindow();
  const size_t before = sim.records().size();
  sim.Lose({g1[1], g1[2]});
  sim.Advance(absl::Seconds(2));
  sim.HeartbeatAllExcept({});
  sim.Tick();
  EXPECT_TRUE(sim.FormedSince(before).empty());
  EXPECT_EQ(sim.progress().waiting(),
            "waiting for workers: 1 available, workers.min is 2 (workers.count 3)");
  const std::optional<absl::Time> next = sim.machine().NextDeadline();
  ASSERT_TRUE(next.has_value());
  EXPECT_GT(*next, sim.now());  // only the leases; the passed grace is not due again
  EXPECT_EQ(sim.progress().optimizer_update_id(), 2);

  // One worker comes back: the survivor seeds a generation of 2 at once.
  sim.Start(1);
  const std::vector<v1::GenerationFormed> formed = FormedWith(sim, before, 2);
  ASSERT_EQ(formed.size(), 1u);
  EXPECT_FALSE(formed[0].rolled_back());
  EXPECT_EQ(formed[0].worker_ids(0), g1[0]);
  EXPECT_EQ(formed[0].assignment().optimizer_update_id(), 2);
  EXPECT_EQ(sim.progress().rollbacks(), 0);
}

// Catches: a shrunk job that never grows back, grows past workers.count, or grows in the middle
// of a window (its reports would be thrown away).
TEST(StepMachineTest, GrowsBackToCountAtAWindowBoundary) {
  SimulatedRanks sim(ResolvedSpec(Elastic(3, 1, "0s")));
  const std::vector<std::string> g1 = sim.Start(3);
  sim.RunWindow();
  sim.Lose({g1[1], g1[2]});  // a generation of 1 at once
  ASSERT_EQ(sim.Ranks().size(), 1u);
  ASSERT_EQ(sim.RunWindow().record().world_size(), 1);

  // Two workers come back while window 3 is in flight: it ends in the generation of 1.
  ASSERT_TRUE(sim.Begin(0, 3, 10)->ready);
  sim.Start(2);
  ASSERT_EQ(sim.Ranks().size(), 1u);
  const size_t before = sim.records().size();
  auto c = sim.Complete(0, 3, RankReport{});
  ASSERT_TRUE(c.ok() && c->ready) << c.status();
  EXPECT_EQ(c->response.decision().outcome(), v1::COMMIT);
  // Then the generation ends and, once the member says it holds update 3, the next one has 3.
  EXPECT_TRUE(sim.FormedSince(before).empty());  // not before it applied update 3
  ASSERT_TRUE(sim.HeartbeatAs(g1[0], 3, /*idle_after=*/sim.generation()).ok());
  const std::vector<v1::GenerationFormed> formed = FormedWith(sim, before, 3);
  ASSERT_EQ(formed.size(), 1u);
  EXPECT_EQ(formed[0].worker_ids(0), g1[0]);
  EXPECT_EQ(formed[0].assignment().state_source(), v1::Assignment::BROADCAST);
  EXPECT_EQ(formed[0].assignment().next_window_id(), 4);
  EXPECT_EQ(sim.RunWindow().record().world_size(), 3);

  // More workers than workers.count: never more ranks than it.
  sim.Start(2);
  sim.RunWindow();
  EXPECT_EQ(sim.Ranks().size(), 3u);
}

// Catches: growth held up for ever by pipelining. Every rank sends the next window's
// BeginWindow ahead, so that window always has begin reports when a window ends; they must not
// stop the generation from growing at the boundary (their calls are answered ABORTED).
TEST(StepMachineTest, GrowsAtAWindowBoundaryThoughTheNextWindowWasBegunAhead) {
  SimulatedRanks sim(ResolvedSpec(Elastic(3, 1, "0s")));
  const std::vector<std::string> g1 = ShrunkToOneInWindow2(sim);
  const v1::BeginWindowRequest ahead = sim.BeginRequest(0, 3, 10);  // sent during window 2
  auto held = sim.Begin(ahead);
  ASSERT_TRUE(held.ok()) << held.status();
  EXPECT_FALSE(held->ready);
  sim.Start(2);  // two workers come back while window 2 is in flight
  const size_t before = sim.records().size();
  auto c = sim.Complete(0, 2, RankReport{});
  ASSERT_TRUE(c.ok() && c->ready) << c.status();
  EXPECT_EQ(c->response.decision().outcome(), v1::COMMIT);
  // The generation ended at the boundary: the held call, polled again, is ABORTED.
  EXPECT_EQ(CodeOf(sim.Begin(ahead)), absl::StatusCode::kAborted);
  ASSERT_TRUE(sim.HeartbeatAs(g1[0], 2, /*idle_after=*/sim.generation()).ok());
  const std::vector<v1::GenerationFormed> formed = FormedWith(sim, before, 3);
  ASSERT_EQ(formed.size(), 1u);
  EXPECT_EQ(formed[0].worker_ids(0), g1[0]);
  EXPECT_EQ(formed[0].assignment().next_window_id(), 3);
  EXPECT_EQ(sim.RunWindow().record().world_size(), 3);
}

// A generation whose only state holder dies before it seeded the newcomer: the newcomer holds
// nothing, so the next generation rolls back to the checkpoint instead of broadcasting from
// it. Catches: seeding a generation from a replica that never received the state (seen with
// real processes when two leases expired a millisecond apart).
TEST(StepMachineTest, NewcomerThatNeverSyncedDoesNotSeedTheNextGeneration) {
  SimulatedRanks sim(ResolvedSpec(WithCheckpoints(2, Fp16(1024, 3))));
  const std::vector<std::string> g1 = sim.Start(2);
  sim.RunWindow();
  const v1::WindowDecision d2 = sim.RunWindow();
  ASSERT_TRUE(d2.write_checkpoint());
  ASSERT_TRUE(sim.Ack(d2.checkpoint_id(), 2).ok());
  sim.RunWindow();  // update 3
  auto heartbeat = [&](const std::string& id, int64_t applied) {
    v1::HeartbeatRequest req;
    req.set_job_id(sim.job().job_id());
    req.set_worker_id(id);
    *req.mutable_dataset() = sim.dataset();
    req.set_applied_update_id(applied);
    ASSERT_TRUE(sim.machine().Heartbeat(req, sim.now()).ok());
    sim.Drain();
  };
  const std::string c = sim.AddWorker();
  heartbeat(c, 0);  // a fresh replica: initial weights only
  sim.Advance(absl::Seconds(6));
  heartbeat(g1[1], 3);
  heartbeat(c, 0);
  sim.Advance(absl::Seconds(5));
  sim.Tick();  // g1[0] lost: generation 2 = {g1[1] (holds update 3), c}
  ASSERT_EQ(sim.generation(), 2);
  EXPECT_EQ(sim.Ranks(), (std::vector<std::string>{g1[1], c}));

  const std::string d = sim.AddWorker();
  heartbeat(d, 0);
  sim.Advance(absl::Seconds(6));
  heartbeat(c, 0);
  heartbeat(d, 0);
  sim.Advance(absl::Seconds(5));
  const size_t before = sim.records().size();
  sim.Tick();  // g1[1] lost before anyone reported a window of generation 2
  // c may still be receiving the state (its broadcast fails only now): no rollback yet.
  EXPECT_TRUE(sim.FormedSince(before).empty());
  ASSERT_TRUE(sim.HeartbeatAs(c, 0, /*idle_after=*/2).ok());  // it gave generation 2 up
  const v1::GenerationFormed* f = nullptr;
  for (size_t i = before; i < sim.records().size(); ++i) {
    if (sim.records()[i].has_generation_formed()) f = &sim.records()[i].generation_formed();
  }
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->generation(), 3);
  EXPECT_EQ(f->assignment().state_source(), v1::Assignment::CHECKPOINT);
  EXPECT_TRUE(f->rolled_back());
  EXPECT_EQ(f->assignment().optimizer_update_id(), 2);
}

// Catches: a rollback with no durable checkpoint that keeps the lost ids instead of
// restarting from the initial weights (INIT) with every id at 0.
TEST(StepMachineTest, AllLostWithoutDurableCheckpointRestartsFromInit) {
  SimulatedRanks sim(ResolvedSpec(Fp16(1024, 1)));
  const std::vector<std::string> g1 = sim.Start(2);
  sim.RunWindow();
  sim.RunWindow();
  ASSERT_EQ(sim.progress().loss_scale(), 4096);
  sim.Lose(g1);
  const size_t before = sim.records().size();
  sim.Start(2);
  const v1::GenerationFormed* f = nullptr;
  for (size_t i = before; i < sim.records().size(); ++i) {
    if (sim.records()[i].has_generation_formed()) f = &sim.records()[i].generation_formed();
  }
  ASSERT_NE(f, nullptr);
  EXPECT_TRUE(f->rolled_back());
  EXPECT_EQ(f->assignment().state_source(), v1::Assignment::INIT);
  EXPECT_EQ(f->assignment().next_window_id(), 1);
  EXPECT_EQ(f->assignment().optimizer_update_id(), 0);
  const v1::JobProgress p = sim.progress();
  EXPECT_EQ(p.window_id(), 0);
  EXPECT_EQ(p.optimizer_update_id(), 0);
  EXPECT_EQ(p.scheduler_step(), 0);
  EXPECT_EQ(p.cumulative_tokens(), 0);
  EXPECT_EQ(p.checkpoint_id(), 0);
  EXPECT_EQ(p.loss_scale(), 1024);
  EXPECT_EQ(sim.RunWindow().record().window_id(), 1);
}

// Catches: a fresh job whose workers all die before any update being "rolled back" (or
// losing checkpoint 0's pending write).
TEST(StepMachineTest, AllLostBeforeAnyUpdateStartsFresh) {
  SimulatedRanks sim(ResolvedSpec(WithCheckpoints(10)));
  const std::vector<std::string> g1 = sim.Start(2);
  sim.Lose(g1);
  const std::vector<std::string> g2 = sim.Start(2);
  auto hb = sim.Heartbeat(g2[0]);
  ASSERT_TRUE(hb.ok());
  ASSERT_TRUE(hb->assigned());
  EXPECT_EQ(hb->assignment().generation(), 2);
  EXPECT_EQ(hb->assignment().state_source(), v1::Assignment::INIT);
  ASSERT_TRUE(hb->assignment().has_pending_checkpoint_id());
  EXPECT_EQ(hb->assignment().pending_checkpoint_id(), 0);
  EXPECT_FALSE(sim.machine().Snapshot().generation().rolled_back());
}

// --- stragglers.replace_below: a slow rank drained, a standby in its place ---

// Two ranks, rank 1 three times slower, scored over one window and drained after three below
// 0.5 (a spec for the tests below).
SpecOptions ReplaceSlowRanks() {
  SpecOptions o;
  o.workers = 2;
  o.max_updates = 20;
  o.stragglers = R"({"score_windows":1,"replace_below":0.5,"replace_after_windows":3})";
  return o;
}

std::vector<RankReport> RankOneThreeTimesSlower() {
  std::vector<RankReport> reports = Reports(2);
  reports[0].compute_seconds = 0.1;
  reports[1].compute_seconds = 0.3;
  return reports;
}

const v1::WorkerInfo* InfoOf(const std::vector<v1::WorkerInfo>& workers, const std::string& id) {
  for (const v1::WorkerInfo& w : workers) {
    if (w.worker_id() == id) return &w;
  }
  return nullptr;
}

// Catches: a straggler drained in the middle of a window (its reports thrown away), before its
// streak is long enough, without a standby (the world would shrink), or replaced by a
// generation that rolls back or re-initialises the weights instead of broadcasting them.
TEST(StepMachineTest, ASlowRankIsDrainedAtAWindowBoundaryAndAStandbyTakesItsRank) {
  SimulatedRanks sim(ResolvedSpec(ReplaceSlowRanks()));
  sim.Start(2);
  const std::string fast = sim.Ranks().at(0), slow = sim.Ranks().at(1);
  for (int w = 0; w < 3; ++w)
    EXPECT_EQ(sim.RunWindow(RankOneThreeTimesSlower()).outcome(), v1::COMMIT);
  // Three windows below 0.5, but nobody to take its place: it stays.
  EXPECT_EQ(sim.job().progress().rank_scores(1).windows_below(), 3);
  EXPECT_EQ(sim.Ranks(), (std::vector<std::string>{fast, slow}));

  const std::string standby = sim.Start(1).at(0);
  const size_t before = sim.records().size();
  const v1::BeginWindowRequest next_of_slow = sim.BeginRequest(1, 5, 10);
  EXPECT_EQ(sim.RunWindow(RankOneThreeTimesSlower()).outcome(), v1::COMMIT);  // update 4
  const std::vector<v1::WorkerInfo> workers = sim.machine().Workers();
  const v1::WorkerInfo* drained = InfoOf(workers, slow);
  ASSERT_NE(drained, nullptr);
  EXPECT_EQ(drained->state(), v1::LOST);
  EXPECT_THAT(drained->drained(), ::testing::HasSubstr("below stragglers.replace_below 0.5 for 4"));
  // Told to exit, not to register again: its heartbeat is answered, with why.
  absl::StatusOr<v1::HeartbeatResponse> told = sim.Heartbeat(slow);
  ASSERT_TRUE(told.ok()) << told.status();
  EXPECT_EQ(told->drained(), drained->drained());
  EXPECT_FALSE(told->assigned());
  EXPECT_EQ(CodeOf(sim.Begin(next_of_slow)), absl::StatusCode::kNotFound);

  // The survivor says it applied update 4: the next generation takes the standby, seeded from
  // the survivor, at the same update.
  ASSERT_TRUE(sim.HeartbeatAs(fast, 4, /*idle_after=*/sim.generation()).ok());
  const std::vector<v1::GenerationFormed> formed = sim.FormedSince(before);
  ASSERT_EQ(formed.size(), 1u);
  EXPECT_THAT(formed[0].worker_ids(), ::testing::ElementsAre(fast, standby));
  EXPECT_EQ(formed[0].assignment().state_source(), v1::Assignment::BROADCAST);
  EXPECT_EQ(formed[0].assignment().optimizer_update_id(), 4);
  EXPECT_EQ(formed[0].assignment().next_window_id(), 5);
  EXPECT_FALSE(formed[0].rolled_back());
  // No window was aborted for it.
  EXPECT_EQ(sim.progress().windows_aborted(), 0);
  EXPECT_EQ(sim.RunWindow().record().world_size(), 2);

  // Journaled: a replayed registry has the same workers (the drained one LOST, with its reason).
  JobRegistry replayed(sim.options());
  for (const v1::JournalRecord& r : sim.records()) ASSERT_TRUE(replayed.Apply(r).ok());
  const std::vector<v1::WorkerInfo> again = (*replayed.Machine(sim.job_id()))->Workers();
  ASSERT_NE(InfoOf(again, slow), nullptr);
  EXPECT_EQ(InfoOf(again, slow)->drained(), drained->drained());
  EXPECT_EQ(InfoOf(again, standby)->state(), v1::ACTIVE);
}

// Catches: a rank drained for a slow stretch it recovered from (the streak must be unbroken),
// and a drain without the policy.
TEST(StepMachineTest, ARankThatRecoversOrAJobWithoutThePolicyIsNotDrained) {
  for (const bool policy : {true, false}) {
    SpecOptions o = ReplaceSlowRanks();
    if (!policy) o.stragglers = "";
    SimulatedRanks sim(ResolvedSpec(o));
    sim.Start(3);  // a standby from the start
    ASSERT_EQ(sim.Ranks().size(), 2u);
    const std::vector<std::string> ranks = sim.Ranks();
    for (int w = 0; w < 8; ++w) {
      std::vector<RankReport> reports = RankOneThreeTimesSlower();
      if (policy && w % 3 == 2) reports[1].compute_seconds = 0.1;  // never three in a row
      EXPECT_EQ(sim.RunWindow(reports).outcome(), v1::COMMIT);
    }
    EXPECT_EQ(sim.Ranks(), ranks) << (policy ? "recovering rank" : "no policy");
  }
}

// Catches: a worker faulty max_suspect times kept training, or drained mid-window.
TEST(StepMachineTest, AWorkerFaultyMaxSuspectTimesIsDrainedForAStandby) {
  SimulatedRanks sim(ResolvedSpec(Validated(R"({"rerun_on":["nonfinite"],"max_suspect":2})")));
  sim.Start(3);  // two ranks and a standby
  const std::vector<std::string> ranks = sim.Ranks();
  for (int64_t window = 1; window <= 2; ++window) {
    sim.BeginAll(window, {10, 10});
    std::vector<RankReport> first = Checksummed();
    first[1].loss_sum = std::numeric_limits<double>::quiet_NaN();
    EXPECT_EQ(sim.CompleteWithRerun(window, first, Checksummed()).outcome(), v1::COMMIT);
    if (window == 1) {
      EXPECT_EQ(sim.Ranks(), ranks) << "drained after one fault of two";
    }
  }
  const std::vector<v1::WorkerInfo> workers = sim.machine().Workers();
  const v1::WorkerInfo* drained = InfoOf(workers, ranks[1]);
  ASSERT_NE(drained, nullptr);
  EXPECT_EQ(drained->state(), v1::LOST);
  EXPECT_THAT(drained->drained(), ::testing::HasSubstr("faulty: a re-run found"));
  ASSERT_TRUE(sim.HeartbeatAs(ranks[0], 2, /*idle_after=*/sim.generation()).ok());
  ASSERT_EQ(sim.Ranks().size(), 2u);
  EXPECT_EQ(sim.Ranks()[0], ranks[0]);
  EXPECT_NE(sim.Ranks()[1], ranks[1]);
}

}  // namespace
}  // namespace trainstep
