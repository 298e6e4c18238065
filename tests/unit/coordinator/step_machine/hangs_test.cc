// StepMachine tests: hung ranks (coordinator/step_machine/hangs.cc): alive, heartbeating, but
// stuck in a step of their own work while their peers wait.
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/coordinator/step_machine/step_machine_test_util.h"

namespace trainstep {
namespace {

using testing_util::Elastic;
using testing_util::FormedWith;
using testing_util::ResolvedSpec;
using testing_util::SimulatedRanks;

// The WorkerLost records since `from`.
std::vector<v1::WorkerLost> LostSince(const SimulatedRanks& sim, size_t from) {
  std::vector<v1::WorkerLost> out;
  for (size_t i = from; i < sim.records().size(); ++i) {
    if (sim.records()[i].has_worker_lost()) out.push_back(sim.records()[i].worker_lost());
  }
  return out;
}

// Catches the probe's finding: a rank held (alive, heartbeating) before a window stalls every
// other rank for as long as it is held. Past the hang deadline (the 5 s floor here: the
// simulated windows take no time) it is fenced, named with where it was stuck, and the job
// re-forms at once without it.
TEST(StepMachineTest, ARankStuckInItsOwnWorkWhileItsPeersWaitIsFenced) {
  SimulatedRanks sim(ResolvedSpec(Elastic(3, 2, "5s")));
  sim.Start(3);
  sim.RunWindow();
  sim.RunWindow();
  const std::vector<std::string> ranks = sim.Ranks();
  EXPECT_EQ(sim.progress().hang_deadline_ms(), 5000);
  const size_t before = sim.records().size();
  ASSERT_TRUE(sim.HeartbeatInPhase(ranks[0], v1::COMPUTE_PHASE_REPORT, absl::Seconds(6)).ok());
  ASSERT_TRUE(sim.HeartbeatInPhase(ranks[1], v1::COMPUTE_PHASE_REPORT, absl::Seconds(6)).ok());
  ASSERT_TRUE(sim.HeartbeatInPhase(ranks[2], v1::COMPUTE_PHASE_DATA, absl::Seconds(4)).ok());
  sim.Tick();
  EXPECT_TRUE(LostSince(sim, before).empty()) << "fenced before its deadline";

  sim.Advance(absl::Milliseconds(1001));  // 5.001 s in its step now
  sim.Tick();
  const std::vector<v1::WorkerLost> lost = LostSince(sim, before);
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_EQ(lost[0].worker_id(), ranks[2]);
  EXPECT_EQ(lost[0].hung_phase(), v1::COMPUTE_PHASE_DATA);
  EXPECT_NE(lost[0].reason().find("rank 2 stayed in data for 5.001s"), std::string::npos)
      << lost[0].reason();
  EXPECT_NE(lost[0].reason().find("hang deadline 5s"), std::string::npos) << lost[0].reason();
  const std::vector<v1::GenerationFormed> formed = FormedWith(sim, before, 2);
  ASSERT_EQ(formed.size(), 1u);  // re-formed at once, from the ranks that hold the update
  EXPECT_FALSE(formed[0].rolled_back());
  EXPECT_EQ(sim.progress().hangs(), 1);
  EXPECT_NE(sim.progress().last_hang().find(ranks[2]), std::string::npos);
  EXPECT_EQ(sim.RunWindow().outcome(), v1::COMMIT);
}

// Catches fencing a whole job that is slow everywhere at once (a shared file system stalls,
// every rank held): no rank waits for another, so none is to blame, and fencing them all
// would throw away every replica.
TEST(StepMachineTest, NobodyIsFencedWhenNoRankWaitsForAnother) {
  SimulatedRanks sim(ResolvedSpec(Elastic(3, 2, "5s")));
  sim.Start(3);
  sim.RunWindow();
  const size_t before = sim.records().size();
  for (const std::string& id : sim.Ranks()) {
    ASSERT_TRUE(sim.HeartbeatInPhase(id, v1::COMPUTE_PHASE_DATA, absl::Seconds(60)).ok());
  }
  sim.Tick();
  EXPECT_TRUE(LostSince(sim, before).empty());
  EXPECT_EQ(sim.progress().world_size(), 3);
}

// Catches a fenced worker taken straight back: it registers again from its heartbeat thread
// while its compute thread may still hang, and a generation built on it would hang again.
// Taken once it says it waits for an assignment.
TEST(StepMachineTest, AStandbyIsTakenOnlyOnceItsComputeThreadWaitsForAnAssignment) {
  SimulatedRanks sim(ResolvedSpec(Elastic(3, 2, "5s")));
  sim.Start(3);
  sim.RunWindow();
  const std::vector<std::string> ranks = sim.Ranks();
  ASSERT_TRUE(sim.HeartbeatInPhase(ranks[0], v1::COMPUTE_PHASE_REPORT, absl::Seconds(9)).ok());
  ASSERT_TRUE(sim.HeartbeatInPhase(ranks[1], v1::COMPUTE_PHASE_REPORT, absl::Seconds(9)).ok());
  ASSERT_TRUE(sim.HeartbeatInPhase(ranks[2], v1::COMPUTE_PHASE_DATA, absl::Seconds(9)).ok());
  sim.Tick();
  ASSERT_EQ(sim.progress().world_size(), 2);

  const std::string again = sim.AddWorker();  // the fenced process, under a new identity
  ASSERT_TRUE(sim.HeartbeatInPhase(again, v1::COMPUTE_PHASE_DATA, absl::Seconds(10)).ok());
  sim.RunWindow();
  EXPECT_EQ(sim.progress().world_size(), 2) << "grew onto a stuck compute thread";
  ASSERT_TRUE(sim.HeartbeatInPhase(again, v1::COMPUTE_PHASE_IDLE, absl::Milliseconds(5)).ok());
  const size_t before = sim.records().size();
  sim.RunWindow();  // the boundary after it: the generation ends to grow
  for (const std::string& id : {ranks[0], ranks[1]}) {  // once the members applied the decision
    ASSERT_TRUE(sim.HeartbeatAs(id, sim.progress().optimizer_update_id(), sim.generation()).ok());
  }
  EXPECT_FALSE(FormedWith(sim, before, 3).empty());
  EXPECT_EQ(sim.Ranks().size(), 3u);
}

}  // namespace
}  // namespace trainstep
