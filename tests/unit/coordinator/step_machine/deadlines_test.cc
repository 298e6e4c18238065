// StepMachine tests: Leases, grace periods and the rendezvous guard
// (coordinator/step_machine/deadlines.cc).
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "coordinator/step_machine.h"
#include "gtest/gtest.h"
#include "tests/unit/coordinator/step_machine/step_machine_test_util.h"

namespace trainstep {
namespace {

using testing_util::CodeOf;
using testing_util::ResolvedSpec;
using testing_util::SimulatedRanks;

// Catches a dead process costing a whole lease: a dropped Attach stream ends the worker's lease
// after the short grace — unless it attaches again or heartbeats, and only for its latest stream.
TEST(StepMachineTest, DroppedAttachStreamLosesTheWorkerAfterTheGrace) {
  MachineOptions options;
  options.detach_grace = absl::Milliseconds(300);
  SimulatedRanks sim(ResolvedSpec({}), options);
  const std::vector<std::string> ids = sim.Start(3);  // two ranks and a spare
  ASSERT_EQ(sim.RunWindow().outcome(), v1::COMMIT);
  const std::vector<std::string> g1 = sim.Ranks();
  auto attach = [&](const std::string& id, uint64_t seq) {
    v1::AttachRequest req;
    req.set_job_id(sim.job_id());
    req.set_worker_id(id);
    return sim.machine().Attach(req, seq, sim.now());
  };
  ASSERT_TRUE(attach(g1[0], 1).ok());
  ASSERT_TRUE(attach(g1[1], 2).ok());
  ASSERT_TRUE(attach(g1[1], 3).ok());  // g1[1] re-attached; stream 2 ends late

  sim.machine().Detached(g1[1], 2, sim.now());  // not its latest stream: nothing changes
  sim.machine().Detached(g1[0], 1, sim.now());
  ASSERT_EQ(sim.machine().NextDeadline(), sim.now() + absl::Milliseconds(300));
  sim.Advance(absl::Milliseconds(299));
  ASSERT_TRUE(sim.Heartbeat(g1[1]).ok());  // the survivor says it holds update 1
  sim.Tick();
  EXPECT_EQ(sim.Ranks(), g1);
  sim.Advance(absl::Milliseconds(1));
  sim.Tick();
  EXPECT_EQ(sim.generation(), 2);
  EXPECT_EQ(sim.machine().updates().size(), 1u);  // nothing was in flight
  EXPECT_EQ(CodeOf(attach(g1[0], 4).status()), absl::StatusCode::kNotFound);

  // A worker whose stream dropped but which heartbeats within the grace keeps its lease.
  const std::string rank0 = sim.Ranks()[0];
  ASSERT_TRUE(attach(rank0, 5).ok());
  sim.machine().Detached(rank0, 5, sim.now());
  sim.Advance(absl::Milliseconds(100));
  ASSERT_TRUE(sim.Heartbeat(rank0).ok());
  sim.Advance(absl::Seconds(1));
  sim.Tick();
  for (const v1::WorkerInfo& w : sim.machine().Workers()) {
    if (w.worker_id() == rank0) EXPECT_EQ(w.state(), v1::ACTIVE);
  }
  EXPECT_EQ(sim.generation(), 2);
}

// Catches a rank blocked in the collective's rendezvous for a generation that is over waiting
// until its deadline (seconds) instead of rejoining at once.
TEST(StepMachineTest, RendezvousReadsOfAnEndedGenerationAreAborted) {
  SimulatedRanks sim(ResolvedSpec({}));
  const std::vector<std::string> ids = sim.Start(2);
  const std::string g1 = absl::StrCat(sim.job_id(), "/g1/rank_0");
  const std::string g2 = absl::StrCat(sim.job_id(), "/g2/rank_0");
  EXPECT_TRUE(sim.machine().CheckRendezvousKey(1, g1).ok());
  EXPECT_TRUE(sim.machine().CheckRendezvousKey(2, g2).ok());  // not formed yet: nothing to end
  sim.Lose({ids[1]});  // generation 1 breaks; no standby to form generation 2
  EXPECT_EQ(sim.machine().CheckRendezvousKey(1, g1).code(), absl::StatusCode::kAborted);
  // Decided by the request's generation, not by the key's words.
  EXPECT_EQ(sim.machine().CheckRendezvousKey(1, "no-generation-in-here").code(),
            absl::StatusCode::kAborted);
  EXPECT_TRUE(sim.machine().CheckRendezvousKey(0, g1).ok());  // outside any generation
  sim.Start(1);
  ASSERT_EQ(sim.generation(), 2);
  EXPECT_EQ(sim.machine().CheckRendezvousKey(1, g1).code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(sim.machine().CheckRendezvousKey(2, g2).ok());
}

// Catches a worker that died while the coordinator was down costing a whole lease after the
// restart: it has the reconnect grace to be heard from; the live ones speak well within it.
TEST(StepMachineTest, AfterARestartAWorkerNotHeardFromIsLostAfterTheReconnectGrace) {
  MachineOptions options;
  options.reconnect_grace = absl::Seconds(3);
  SimulatedRanks sim(ResolvedSpec({}), options);
  const std::vector<std::string> ids = sim.Start(3);  // two ranks and a spare
  ASSERT_EQ(sim.RunWindow().outcome(), v1::COMMIT);
  const std::vector<std::string> g1 = sim.Ranks();
  sim.registry().Restore(sim.registry().Snapshot(), sim.now());
  sim.registry().Recovered(sim.now());
  sim.Advance(absl::Milliseconds(300));
  sim.HeartbeatAllExcept({g1[1]});  // g1[1] died with the coordinator
  sim.Advance(absl::Seconds(3) - absl::Milliseconds(300));
  sim.Tick();
  EXPECT_EQ(sim.generation(), 2);  // well before the 10 s lease
  for (const v1::WorkerInfo& w : sim.machine().Workers()) {
    if (w.worker_id() == g1[1]) EXPECT_EQ(w.state(), v1::LOST);
  }
  // The ones that attach again keep a whole lease.
  uint64_t seq = 0;
  for (const v1::WorkerInfo& w : sim.machine().Workers()) {
    if (w.state() == v1::LOST) continue;
    v1::AttachRequest attach;
    attach.set_job_id(sim.job_id());
    attach.set_worker_id(w.worker_id());
    ASSERT_TRUE(sim.machine().Attach(attach, ++seq, sim.now()).ok());
  }
  sim.Advance(absl::Seconds(5));
  sim.Tick();
  EXPECT_EQ(sim.generation(), 2);
}

// Catches the chaos campaign's 10 s restart_gap_kill recoveries: a rank heartbeated to the
// restarted coordinator and died before its Attach stream opened. The heartbeat renewed a
// whole lease, and nothing else could tell the coordinator it was gone.
TEST(StepMachineTest, AfterARestartAHeartbeatWithoutAttachRenewsOnlyTheReconnectGrace) {
  MachineOptions options;
  options.reconnect_grace = absl::Seconds(3);
  SimulatedRanks sim(ResolvedSpec({}), options);
  sim.Start(3);  // two ranks and a spare
  ASSERT_EQ(sim.RunWindow().outcome(), v1::COMMIT);
  const std::vector<std::string> g1 = sim.Ranks();
  sim.registry().Restore(sim.registry().Snapshot(), sim.now());
  sim.registry().Recovered(sim.now());
  sim.Advance(absl::Milliseconds(100));
  sim.HeartbeatAllExcept({});  // everyone speaks once; g1[1] then dies
  // A worker that keeps heartbeating without a stream (within the grace) stays.
  for (int i = 0; i < 3; ++i) {
    sim.Advance(absl::Seconds(2));
    sim.HeartbeatAllExcept({g1[1]});
    sim.Tick();
  }
  EXPECT_EQ(sim.generation(), 2);  // g1[1] lost ~3 s after its heartbeat, not at 10 s
  bool lost = false;
  for (const v1::WorkerInfo& w : sim.machine().Workers()) {
    if (w.worker_id() == g1[1]) lost = w.state() == v1::LOST;
    if (w.worker_id() != g1[1]) EXPECT_NE(w.state(), v1::LOST) << w.worker_id();
  }
  EXPECT_TRUE(lost);
}

// Catches the chaos tool's 120 s stall: a generation formed just before the coordinator was
// killed rendezvoused across the restart; the keys its ranks had set lived only in the old
// process's store, and the others waited for them until the store timeout.
TEST(StepMachineTest, RendezvousThatStraddledARestartEndsItsGeneration) {
  SimulatedRanks sim(ResolvedSpec({}));
  sim.Start(2);
  ASSERT_EQ(sim.generation(), 1);
  const std::string key = absl::StrCat(sim.job_id(), "/g1//0/rank_0");
  // Without a restart a missing key is only not set yet.
  EXPECT_TRUE(sim.machine().RendezvousKeyMissing(1, key, sim.now()).ok());
  sim.registry().Restore(sim.registry().Snapshot(), sim.now());
  sim.registry().Recovered(sim.now());
  sim.HeartbeatAllExcept({});  // the live ranks speak to the new coordinator at once
  EXPECT_TRUE(sim.machine().RendezvousKeyMissing(0, "unrelated", sim.now()).ok());
  const size_t before = sim.records().size();
  EXPECT_EQ(sim.machine().RendezvousKeyMissing(1, key, sim.now()).code(),
            absl::StatusCode::kAborted);
  sim.Drain();
  bool ended = false;
  for (size_t i = before; i < sim.records().size(); ++i) {
    ended |= sim.records()[i].has_generation_ended();
  }
  EXPECT_TRUE(ended);
  EXPECT_EQ(sim.generation(), 2);  // formed again at once: nothing was trained yet
  // The new generation's keys are this coordinator's own: a missing one just waits.
  EXPECT_TRUE(sim.machine()
                  .RendezvousKeyMissing(2, absl::StrCat(sim.job_id(), "/g2//0/rank_0"), sim.now())
                  .ok());
  EXPECT_EQ(sim.RunWindow().outcome(), v1::COMMIT);
}

}  // namespace
}  // namespace trainstep
