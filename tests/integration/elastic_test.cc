// Elastic world size through real processes: workers killed for good, the job going
// on with fewer ranks at once, growing back when workers return, and waiting
// below workers.min. Each case compares its final weights with the same job run by
// workers.count workers without a fault: the samples of a window do not depend on how many
// ranks split them, so the weights must not either (up to float summation order).
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/job_state.h"
#include "tests/integration/cluster_test.h"
#include "tests/integration/final_weights.h"
#include "tests/integration/process_cluster.h"
#include "worker/checkpoint/checkpoint_dir.h"

namespace trainstep {
namespace {

using testing::ExpectSameWeights;

constexpr int64_t kDefaultUpdates = 300;

class ElasticTest : public testing::ClusterTest {
 protected:
  ElasticTest() : ClusterTest("trainstep-elastic-") {}

  // Updates of every job of the test (reference included); set before Reference().
  int64_t updates_ = kDefaultUpdates;

  // tiny mlp, SGD with momentum, checkpoints every 50 updates; `workers` is the spec's section.
  std::string Spec(const std::string& ckpt, const std::string& workers) {
    return absl::StrCat(
        R"({"seed":11,"model":{"mlp":{"hidden":16}},)",
        R"("data":{"synthetic_regression":{"samples":96,"in_features":4},"shuffle":true},)",
        R"("batch":{"micro_batch_size":2,"accumulation_steps":2},"workers":)", workers, ",",
        R"("optimizer":{"sgd":{"lr":0.02,"momentum":0.9}},"stop":{"max_updates":)", updates_,
        R"(},"checkpoint":{"dir":")", ckpt, R"(","every_updates":50,"keep_last":0}})");
  }

  // While this file exists, workers started with HoldFlag() wait before their next window.
  std::string HoldFile() const { return dir_ + "/hold"; }
  std::string HoldFlag() const { return absl::StrCat("--debug_hold_file=", HoldFile()); }

  // Rank processes train far faster than a worker process starts (LibTorch's load alone takes
  // seconds on a loaded machine), so newcomers could find the job over. With the job's ranks
  // started with HoldFlag(): once its latest commit was made at world size `size`, holds them
  // before their next window (their heartbeats go on), starts `newcomers` workers, and lets the
  // ranks go on once `ready` of them are READY. Fails if the job ended first.
  void StartNewcomersWhileHeld(const std::string& job_id, int size, int newcomers, int ready) {
    const auto committed_at_size = [&](const v1::Job&) {
      const std::vector<int> sizes = WorldSizes(job_id);
      return !sizes.empty() && sizes.back() == size;
    };
    ASSERT_TRUE(WaitUntil(job_id, committed_at_size, absl::Seconds(60))) << cluster_->Logs();
    std::ofstream(HoldFile()) << "held by the test\n";
    for (int i = 0; i < newcomers; ++i) ASSERT_TRUE(cluster_->StartWorker(job_id).ok());
    ASSERT_TRUE(WaitUntil(
        job_id,
        [&](const v1::Job& j) {
          return CountWorkers(job_id, v1::READY) >= ready || IsTerminal(j.state());
        },
        absl::Seconds(120)))
        << cluster_->Logs();
    ASSERT_FALSE(IsTerminal(GetJob(job_id).state()))
        << "the job ended before the newcomers were READY";
    std::filesystem::remove(HoldFile());
  }

  struct Started {
    std::string job_id;
    std::vector<pid_t> pids;
  };
  // Submits the job with `workers`, starts three workers and waits until all three have
  // trained together and `updates` updates are committed (a start may first have shrunk: a
  // worker later than the grace). `worker_flags` go to the three workers.
  Started StartFullWorld(const std::string& ckpt, const std::string& workers, int64_t updates,
                         const std::vector<std::string>& worker_flags = {}) {
    Started s;
    absl::StatusOr<std::string> id = cluster_->Submit(Spec(ckpt, workers));
    EXPECT_TRUE(id.ok()) << id.status();
    if (!id.ok()) return s;
    s.job_id = *id;
    for (int i = 0; i < 3; ++i) s.pids.push_back(*cluster_->StartWorker(*id, worker_flags));
    // Not just formed: a generation of three that committed updates, so that every rank holds
    // the current update (a generation killed while its newcomers receive the state rightly
    // rolls back: seen when this waited only for the world size).
    int64_t full_from = -1;
    EXPECT_TRUE(WaitUntil(
        *id,
        [&](const v1::Job& j) {
          if (j.progress().world_size() != 3) {
            full_from = -1;
            return false;
          }
          if (full_from < 0) full_from = j.progress().optimizer_update_id();
          const int64_t u = j.progress().optimizer_update_id();
          return u >= updates && u >= full_from + 5;
        },
        absl::Seconds(120)))
        << cluster_->Logs();
    return s;
  }

  // Runs the fault-free reference: workers.count 3, three workers.
  ckpt::TensorMap Reference() {
    const std::string ckpt = dir_ + "/ckpt-reference";
    absl::StatusOr<std::string> id = cluster_->Submit(Spec(ckpt, R"({"count":3})"));
    EXPECT_TRUE(id.ok()) << id.status();
    for (int i = 0; i < 3; ++i) EXPECT_TRUE(cluster_->StartWorker(*id).ok());
    absl::StatusOr<v1::Job> done = cluster_->WaitForJob(*id, absl::Seconds(180));
    EXPECT_TRUE(done.ok() && done->state() == v1::SUCCEEDED) << cluster_->Logs();
    return FinalWeights(ckpt);
  }

  ckpt::TensorMap FinalWeights(const std::string& ckpt) {
    return testing::FinalWeights(ckpt, updates_);
  }

  // The world sizes of the committed records, in log order, without repeats.
  std::vector<int> WorldSizes(const std::string& job_id) {
    absl::StatusOr<std::vector<v1::UpdateRecord>> log = cluster_->Updates(job_id);
    EXPECT_TRUE(log.ok());
    std::vector<int> sizes;
    for (const v1::UpdateRecord& r : log.ok() ? *log : std::vector<v1::UpdateRecord>{}) {
      if (r.outcome() == "commit" && (sizes.empty() || sizes.back() != r.world_size())) {
        sizes.push_back(r.world_size());
      }
    }
    return sizes;
  }

  // No update id committed twice (no rollback redid anything).
  void ExpectEachUpdateOnce(const std::string& job_id) {
    absl::StatusOr<std::vector<v1::UpdateRecord>> log = cluster_->Updates(job_id);
    ASSERT_TRUE(log.ok());
    std::set<int64_t> seen;
    for (const v1::UpdateRecord& r : *log) {
      if (r.outcome() != "commit") continue;
      EXPECT_TRUE(seen.insert(r.optimizer_update_id()).second)
          << "update " << r.optimizer_update_id() << " committed twice";
    }
    EXPECT_EQ(seen.size(), static_cast<size_t>(updates_));
  }
};

// Catches a job of workers.count 3 whose worker is killed for good waiting for it (for ever,
// or for the join grace). It goes on with two ranks, and its weights equal the reference's.
TEST_F(ElasticTest, WorkerKilledForGoodFinishesWithFewerAndTheSameWeights) {
  const ckpt::TensorMap reference = Reference();
  const std::string ckpt = dir_ + "/ckpt-elastic";
  const Started started = StartFullWorld(ckpt, R"({"count":3,"min":2,"join_grace":"1s"})", 30);
  ASSERT_FALSE(::testing::Test::HasFailure());
  const std::string* id = &started.job_id;
  const std::vector<pid_t>& pids = started.pids;
  cluster_->Kill(pids[1]);
  absl::StatusOr<v1::Job> done = cluster_->WaitForJob(*id, absl::Seconds(180));
  ASSERT_TRUE(done.ok() && done->state() == v1::SUCCEEDED) << cluster_->Logs();
  EXPECT_EQ(done->progress().world_size(), 2);
  EXPECT_EQ(done->progress().rollbacks(), 0);
  const std::vector<int> sizes = WorldSizes(*id);
  ASSERT_GE(sizes.size(), 2u);
  EXPECT_EQ(std::vector<int>(sizes.end() - 2, sizes.end()), (std::vector<int>{3, 2}));
  ExpectEachUpdateOnce(*id);
  ExpectSameWeights(reference, FinalWeights(ckpt));
}

// Catches a world that can shrink but never grows back (or grows past workers.count): two of
// three are killed, one rank trains alone, then three new workers come — two are taken.
TEST_F(ElasticTest, ShrinksToOneAndGrowsBackToCount) {
  // The updates left after the lone rank's first commit give the test room to set the hold.
  updates_ = 1500;
  const ckpt::TensorMap reference = Reference();
  const std::string ckpt = dir_ + "/ckpt-elastic";
  const Started started =
      StartFullWorld(ckpt, R"({"count":3,"min":1,"join_grace":"0.2s"})", 20, {HoldFlag()});
  ASSERT_FALSE(::testing::Test::HasFailure());
  const std::string* id = &started.job_id;
  const std::vector<pid_t>& pids = started.pids;
  cluster_->Kill(pids[0]);
  cluster_->Kill(pids[2]);
  StartNewcomersWhileHeld(*id, /*size=*/1, /*newcomers=*/3, /*ready=*/2);
  ASSERT_FALSE(::testing::Test::HasFailure());
  absl::StatusOr<v1::Job> done = cluster_->WaitForJob(*id, absl::Seconds(180));
  ASSERT_TRUE(done.ok() && done->state() == v1::SUCCEEDED) << cluster_->Logs();
  const std::vector<int> sizes = WorldSizes(*id);
  ASSERT_GE(sizes.size(), 3u);
  EXPECT_NE(std::find(sizes.begin(), sizes.end(), 1), sizes.end());
  EXPECT_EQ(sizes.back(), 3);
  for (int s : sizes) EXPECT_LE(s, 3);
  EXPECT_EQ(done->progress().rollbacks(), 0);
  ExpectEachUpdateOnce(*id);
  ExpectSameWeights(reference, FinalWeights(ckpt));
}

// Catches a replacement that arrives after the job shrank being left out: the job shrinks
// at once, then takes it at the next window boundary.
TEST_F(ElasticTest, AReplacementThatStartsAfterTheJobShrankJoinsAtABoundary) {
  // Room between the first commit at world size 2 and the job's end for the test to set the
  // hold (seconds at two ranks, not a fraction of one).
  updates_ = 1000;
  const ckpt::TensorMap reference = Reference();
  const std::string ckpt = dir_ + "/ckpt-elastic";
  const Started started =
      StartFullWorld(ckpt, R"({"count":3,"min":2,"join_grace":"0.1s"})", 30, {HoldFlag()});
  ASSERT_FALSE(::testing::Test::HasFailure());
  const std::string* id = &started.job_id;
  const std::vector<pid_t>& pids = started.pids;
  cluster_->Kill(pids[2]);
  StartNewcomersWhileHeld(*id, /*size=*/2, /*newcomers=*/1, /*ready=*/1);
  ASSERT_FALSE(::testing::Test::HasFailure());
  absl::StatusOr<v1::Job> done = cluster_->WaitForJob(*id, absl::Seconds(180));
  ASSERT_TRUE(done.ok() && done->state() == v1::SUCCEEDED) << cluster_->Logs();
  // The start may have shrunk too (a worker later than 0.1 s); what follows the kill is 2, 3.
  const std::vector<int> sizes = WorldSizes(*id);
  ASSERT_GE(sizes.size(), 3u);
  EXPECT_EQ(std::vector<int>(sizes.end() - 3, sizes.end()), (std::vector<int>{3, 2, 3}));
  EXPECT_EQ(done->progress().rollbacks(), 0);
  ExpectEachUpdateOnce(*id);
  ExpectSameWeights(reference, FinalWeights(ckpt));
}

// Catches the probe's finding: one rank held before a window (its process and heartbeats
// alive) stalled every other rank for as long as it was held. It is fenced past the hang
// deadline (spec.hang's 5 s floor: these windows take milliseconds) and the job finishes at two
// ranks while it is still held, with the weights of the fault-free run.
TEST_F(ElasticTest, ARankHeldAliveIsFencedAndTheJobFinishesWithoutIt) {
  const ckpt::TensorMap reference = Reference();
  const std::string ckpt = dir_ + "/ckpt-elastic";
  absl::StatusOr<std::string> id = cluster_->Submit(Spec(ckpt, R"({"count":3,"min":2})"));
  ASSERT_TRUE(id.ok()) << id.status();
  ASSERT_TRUE(cluster_->StartWorker(*id).ok());
  ASSERT_TRUE(cluster_->StartWorker(*id).ok());
  ASSERT_TRUE(cluster_->StartWorker(*id, {HoldFlag()}).ok());
  ASSERT_TRUE(WaitUntil(
      *id,
      [](const v1::Job& j) {
        return j.progress().world_size() == 3 && j.progress().optimizer_update_id() >= 30;
      },
      absl::Seconds(120)))
      << cluster_->Logs();
  std::ofstream(HoldFile()) << "held by the test\n";
  absl::StatusOr<v1::Job> done = cluster_->WaitForJob(*id, absl::Seconds(180));
  ASSERT_TRUE(done.ok() && done->state() == v1::SUCCEEDED) << cluster_->Logs();
  EXPECT_TRUE(std::filesystem::exists(HoldFile()));  // it finished while the rank was held
  std::filesystem::remove(HoldFile());
  EXPECT_EQ(done->progress().hangs(), 1);
  EXPECT_NE(done->progress().last_hang().find("stayed in data for"), std::string::npos)
      << done->progress().last_hang();
  EXPECT_EQ(done->progress().rollbacks(), 0);
  ExpectEachUpdateOnce(*id);
  ExpectSameWeights(reference, FinalWeights(ckpt));
}

// Catches a job below workers.min that trains anyway, rolls back, or waits without saying so:
// it waits visibly (progress.waiting), keeps every update, and goes on when a worker comes.
TEST_F(ElasticTest, BelowMinWaitsVisiblyWithoutARollback) {
  const ckpt::TensorMap reference = Reference();
  const std::string ckpt = dir_ + "/ckpt-elastic";
  const Started started = StartFullWorld(ckpt, R"({"count":3,"min":3})", 30);
  ASSERT_FALSE(::testing::Test::HasFailure());
  const std::string* id = &started.job_id;
  const std::vector<pid_t>& pids = started.pids;
  cluster_->Kill(pids[0]);
  v1::Job waiting;
  ASSERT_TRUE(WaitUntil(
      *id,
      [&](const v1::Job& j) {
        waiting = j;
        return !j.progress().waiting().empty();
      },
      absl::Seconds(30)))
      << cluster_->Logs();
  EXPECT_NE(waiting.progress().waiting().find("workers.min is 3"), std::string::npos)
      << waiting.progress().waiting();
  EXPECT_EQ(waiting.progress().workers_available(), 2);
  const int64_t held = waiting.progress().optimizer_update_id();
  std::this_thread::sleep_for(std::chrono::seconds(2));
  const v1::Job still = GetJob(*id);
  EXPECT_EQ(still.progress().optimizer_update_id(), held);  // nothing trains below min
  EXPECT_EQ(still.state(), v1::RUNNING);
  ASSERT_TRUE(cluster_->StartWorker(*id).ok());
  absl::StatusOr<v1::Job> done = cluster_->WaitForJob(*id, absl::Seconds(180));
  ASSERT_TRUE(done.ok() && done->state() == v1::SUCCEEDED) << cluster_->Logs();
  EXPECT_EQ(done->progress().rollbacks(), 0);
  EXPECT_EQ(WorldSizes(*id), (std::vector<int>{3}));
  ExpectEachUpdateOnce(*id);
  ExpectSameWeights(reference, FinalWeights(ckpt));
}

}  // namespace
}  // namespace trainstep
