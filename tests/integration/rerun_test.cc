// Re-run on suspicion through real processes: a window whose loss or
// gradient is non-finite is computed again by every rank before its decision. A fault
// injected into one rank's first run only (--debug-flip-grad-window, --debug-flip-loss-window)
// is attributed to that rank, and the job's weights equal the fault-free run's; a poisoned
// sample (--debug-poison-sample) reproduces, is attributed to the data with its sample id, and
// its window is skipped.
#include <gtest/gtest.h>

#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/integration/cluster_test.h"
#include "tests/integration/final_weights.h"
#include "tests/integration/process_cluster.h"

namespace trainstep {
namespace {

constexpr int64_t kUpdates = 12;

class RerunTest : public testing::ClusterTest {
 protected:
  RerunTest() : ClusterTest("trainstep-rerun-") {}

  // A small regression job re-running non-finite windows, its final weights in `ckpt`.
  static std::string Spec(const std::string& ckpt) {
    return absl::StrCat(
        R"({"seed":3,"model":{"mlp":{"hidden":32}},)",
        R"("data":{"synthetic_regression":{"samples":512,"in_features":8}},)",
        R"("batch":{"micro_batch_size":4,"accumulation_steps":2},"workers":{"count":2},)",
        R"("optimizer":{"sgd":{"lr":0.01,"momentum":0.9}},"stop":{"max_updates":)", kUpdates,
        R"(},"validate":{"rerun_on":["nonfinite"]},)", R"("checkpoint":{"dir":")", ckpt,
        R"(","every_updates":1000,"keep_last":0}})");
  }

  // Runs the spec with two workers, the first started with `flags0`, the second with
  // `flags1`; returns the job id once it ended (asserting SUCCEEDED).
  std::string Run(const std::string& ckpt, const std::vector<std::string>& flags0,
                  const std::vector<std::string>& flags1) {
    absl::StatusOr<std::string> id = cluster_->Submit(Spec(ckpt));
    EXPECT_TRUE(id.ok()) << id.status();
    if (!id.ok()) return "";
    EXPECT_TRUE(cluster_->StartWorker(*id, flags0).ok());
    EXPECT_TRUE(cluster_->StartWorker(*id, flags1).ok());
    absl::StatusOr<v1::Job> job = cluster_->WaitForJob(*id, absl::Seconds(240));
    EXPECT_TRUE(job.ok()) << job.status() << cluster_->Logs();
    if (job.ok()) EXPECT_EQ(job->state(), v1::SUCCEEDED) << job->message() << cluster_->Logs();
    return *id;
  }

  std::string WorkerIdNamed(const std::string& job_id, const std::string& name) {
    for (const v1::WorkerInfo& w : Workers(job_id)) {
      if (w.name() == name) return w.worker_id();
    }
    return "";
  }

  std::vector<v1::UpdateRecord> Reruns(const std::string& job_id) {
    absl::StatusOr<std::vector<v1::UpdateRecord>> log = cluster_->Updates(job_id);
    EXPECT_TRUE(log.ok()) << log.status();
    std::vector<v1::UpdateRecord> out;
    for (const v1::UpdateRecord& r : log.ok() ? *log : std::vector<v1::UpdateRecord>{}) {
      if (r.has_rerun()) out.push_back(r);
    }
    return out;
  }
};

// Catches: a transient fault blamed on the wrong rank (or on the data), its window skipped or
// committed with the faulty first run (the weights would differ from the fault-free run), and
// a healthy rank whose re-run does not reproduce bit for bit (it would be blamed too).
TEST_F(RerunTest, TransientFaultsAreAttributedToTheirRankAndChangeNoWeight) {
  const std::string ckpt = dir_ + "/ckpt";
  const std::string id = Run(ckpt, {"--name=flips-grad", "--debug_flip_grad_window=3"},
                             {"--name=flips-loss", "--debug_flip_loss_window=6"});
  ASSERT_FALSE(id.empty());
  const std::vector<v1::UpdateRecord> reruns = Reruns(id);
  ASSERT_EQ(reruns.size(), 2u) << cluster_->Logs();
  const std::string grad_worker = WorkerIdNamed(id, "flips-grad");
  const std::string loss_worker = WorkerIdNamed(id, "flips-loss");
  for (const v1::UpdateRecord& r : reruns) {
    std::cout << r.window_id() << ": " << r.rerun().ShortDebugString() << "\n";  // the record
    EXPECT_EQ(r.outcome(), "commit") << r.ShortDebugString();
    EXPECT_EQ(r.rerun().cause(), "nonfinite");
    EXPECT_EQ(r.rerun().verdict(), "transient");
    ASSERT_EQ(r.rerun().worker_ids_size(), 1) << "a healthy rank did not reproduce its run";
    EXPECT_EQ(r.rerun().worker_id(), r.window_id() == 3 ? grad_worker : loss_worker);
  }
  EXPECT_EQ(reruns[0].window_id(), 3);
  EXPECT_EQ(reruns[1].window_id(), 6);
  for (const v1::WorkerInfo& w : Workers(id)) EXPECT_EQ(w.suspect_count(), 1) << w.name();
  const v1::Job job = GetJob(id);
  EXPECT_EQ(job.progress().reruns(), 2);
  EXPECT_EQ(job.progress().reruns_transient(), 2);
  EXPECT_EQ(job.progress().windows_skipped(), 0);

  const std::string reference = dir_ + "/ckpt-reference";
  ASSERT_FALSE(Run(reference, {}, {}).empty());
  testing::ExpectSameWeights(testing::FinalWeights(reference, kUpdates),
                             testing::FinalWeights(ckpt, kUpdates));
}

// Catches: bad data blamed on a rank (a healthy worker marked suspect, then drained), the
// window committed, or the record not naming the sample.
TEST_F(RerunTest, APoisonedSampleIsAttributedToTheDataAndItsWindowSkipped) {
  const std::string flag = "--debug_poison_sample=5";  // both workers read the same bad data
  const std::string id = Run(dir_ + "/ckpt", {flag}, {flag});
  ASSERT_FALSE(id.empty());
  const std::vector<v1::UpdateRecord> reruns = Reruns(id);
  ASSERT_EQ(reruns.size(), 1u) << cluster_->Logs();
  const v1::UpdateRecord& r = reruns[0];
  std::cout << r.window_id() << ": " << r.rerun().ShortDebugString() << "\n";
  EXPECT_EQ(r.outcome(), "skip");
  // Non-finite gradients (OVERFLOW) or loss (NONFINITE_LOSS): skipped either way.
  EXPECT_TRUE(r.reason() == "OVERFLOW" || r.reason() == "NONFINITE_LOSS") << r.reason();
  EXPECT_EQ(r.rerun().verdict(), "persistent");
  ASSERT_GE(r.rerun().sample_ids_size(), 1);
  EXPECT_EQ(r.rerun().sample_ids(0), 5);
  for (const v1::WorkerInfo& w : Workers(id)) EXPECT_EQ(w.suspect_count(), 0) << w.name();
}

}  // namespace
}  // namespace trainstep
