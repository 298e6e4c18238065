// What a job may touch, through the real coordinator and worker binaries:
// a spec naming files outside the worker's --allowed-roots (directly, through "..", or
// through a symlink inside a root) fails cleanly, naming the field; a checkpoint directory
// holding another job's checkpoints is left untouched; two jobs cannot share one directory.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "tests/integration/cluster_test.h"
#include "tests/integration/process_cluster.h"
#include "worker/checkpoint/checkpoint_dir.h"

namespace trainstep {
namespace {

namespace fs = std::filesystem;

// Every file under `dir` with its content: what "deletes nothing, changes nothing" compares.
std::map<std::string, std::string> Snapshot(const std::string& dir) {
  std::map<std::string, std::string> files;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.is_regular_file())
      files[fs::relative(e.path(), dir).string()] = testing::ReadFile(e.path());
  }
  return files;
}

class JobPathsTest : public testing::ClusterTest {
 protected:
  JobPathsTest() : ClusterTest("trainstep-paths-") {}

  void SetUp() override {
    ClusterTest::SetUp();
    root_ = dir_ + "/root";
    outside_ = dir_ + "/outside";
    fs::create_directories(root_ + "/data");
    fs::create_directories(outside_);
    std::ofstream(root_ + "/data/corpus.txt") << std::string(4000, 'a');
    // /etc/shadow's stand-in: readable by the worker's user, outside every root.
    std::ofstream(outside_ + "/shadow") << "root:$6$secret-hash:19000:0:99999:7:::\n";
    ::chmod((outside_ + "/shadow").c_str(), 0600);
  }

  // A one-worker job: submits `spec`, runs a worker limited to the root, waits for the end.
  v1::Job RunLimited(const std::string& spec, int* worker_exit = nullptr) {
    absl::StatusOr<std::string> id = cluster_->Submit(spec);
    EXPECT_TRUE(id.ok()) << id.status();
    if (!id.ok()) return v1::Job();
    EXPECT_TRUE(cluster_->StartWorker(*id, {"--allowed-roots", root_}).ok());
    absl::StatusOr<v1::Job> job = cluster_->WaitForJob(*id, absl::Seconds(120));
    EXPECT_TRUE(job.ok()) << job.status() << cluster_->Logs();
    std::vector<int> exits = cluster_->WaitForWorkers(absl::Seconds(60));
    if (worker_exit != nullptr) *worker_exit = exits.empty() ? -1 : exits.back();
    return job.ok() ? *job : v1::Job();
  }

  static std::string TextSpec(const std::string& path) {
    return absl::StrCat(R"({"name":"text","model":{"tiny_gpt":{"n_layer":1,"d_model":16,)",
                        R"("n_head":1,"seq_len":16}},"data":{"text":{"paths":[")", path,
                        R"("],"seq_len":16}},"workers":{"count":1},"stop":{"max_updates":2}})");
  }

  static std::string MlpSpec(const std::string& ckpt_dir, int max_updates) {
    return absl::StrCat(
        R"({"name":"mlp","seed":3,"model":{"mlp":{"hidden":8}},)",
        R"("data":{"synthetic_regression":{"samples":32,"in_features":4}},)",
        R"("batch":{"micro_batch_size":4,"accumulation_steps":1},"workers":{"count":1},)",
        R"("optimizer":{"sgd":{"lr":0.05}},"stop":{"max_updates":)", max_updates, "},",
        R"("checkpoint":{"dir":")", ckpt_dir, R"(","every_updates":1,"keep_last":1}})");
  }

  std::string root_;
  std::string outside_;
};

// The probe trained on /etc/shadow. Outside the roots, whether named directly, through "..",
// or reached by a symlink inside a data directory, the job fails with a message naming the
// field and the path, the worker exits 1, and nothing was trained.
TEST_F(JobPathsTest, DataOutsideAllowedRootsFailsTheJobCleanly) {
  int exit_code = 0;
  v1::Job direct = RunLimited(TextSpec(outside_ + "/shadow"), &exit_code);
  EXPECT_EQ(direct.state(), v1::FAILED);
  EXPECT_NE(direct.message().find("data.text.paths[0]: " + outside_ + "/shadow"), std::string::npos)
      << direct.message();
  EXPECT_NE(direct.message().find("--allowed-roots " + root_), std::string::npos);
  EXPECT_EQ(direct.progress().optimizer_update_id(), 0);
  EXPECT_EQ(exit_code, 1);

  v1::Job dotdot = RunLimited(TextSpec(root_ + "/data/../../outside/shadow"));
  EXPECT_EQ(dotdot.state(), v1::FAILED);
  EXPECT_NE(dotdot.message().find("resolves to " + outside_ + "/shadow"), std::string::npos)
      << dotdot.message();

  fs::create_symlink(outside_ + "/shadow", root_ + "/data/innocent.txt");
  v1::Job linked = RunLimited(TextSpec(root_ + "/data"));
  EXPECT_EQ(linked.state(), v1::FAILED);
  EXPECT_NE(linked.message().find("data.text.paths[0]: " + root_ + "/data/innocent.txt"),
            std::string::npos)
      << linked.message();
  fs::remove(root_ + "/data/innocent.txt");

  v1::Job inside = RunLimited(TextSpec(root_ + "/data"));
  EXPECT_EQ(inside.state(), v1::SUCCEEDED) << inside.message() << cluster_->Logs();
}

// The probe's pruning deleted someone else's ckpt-0..ckpt-99. A job (keep_last 1) pointed at
// a directory holding another job's checkpoints fails at its first checkpoint naming that
// job, and every file there is unchanged.
TEST_F(JobPathsTest, SomeoneElsesCheckpointsAreNeverDeleted) {
  const std::string ckpt = root_ + "/ckpt";
  for (int id = 0; id <= 5; ++id) {
    ckpt::CheckpointMeta meta;
    meta.job_id = "job-99";
    meta.checkpoint_id = id;
    ckpt::TensorMap model = {{"w", at::full({2, 2}, static_cast<float>(id))}};
    ASSERT_TRUE(ckpt::WriteCheckpoint(ckpt, meta, model, model, 0).ok());
  }
  fs::remove(ckpt + "/" + ckpt::kClaimFile);  // as a trainstep without markers left them
  const std::map<std::string, std::string> before = Snapshot(ckpt);
  ASSERT_EQ(before.size(), 18u);

  v1::Job job = RunLimited(MlpSpec(ckpt, 4));
  EXPECT_EQ(job.state(), v1::FAILED);
  EXPECT_NE(job.message().find("written by job-99"), std::string::npos) << job.message();
  EXPECT_NE(job.message().find("checkpoint.dir " + ckpt), std::string::npos);
  EXPECT_EQ(Snapshot(ckpt), before);
}

// Two jobs sharing a checkpoint dir deleted each other's checkpoints. While the first is live,
// the coordinator refuses the second at submit (FAILED_PRECONDITION naming it); once it has
// ended, the coordinator cannot know, and the second job's worker refuses at its first
// checkpoint (the directory's marker names the first job), leaving the first's intact.
TEST_F(JobPathsTest, TwoJobsCannotShareACheckpointDir) {
  const std::string ckpt = root_ + "/shared";
  absl::StatusOr<std::string> first = cluster_->Submit(MlpSpec(ckpt, 3));
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<std::string> second = cluster_->Submit(MlpSpec(ckpt + "/", 3));
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition) << second.status();
  EXPECT_NE(second.status().message().find("checkpoint directory of " + *first), std::string::npos)
      << second.status();

  ASSERT_TRUE(cluster_->StartWorker(*first, {"--allowed-roots", root_}).ok());
  absl::StatusOr<v1::Job> done = cluster_->WaitForJob(*first, absl::Seconds(120));
  ASSERT_TRUE(done.ok() && done->state() == v1::SUCCEEDED) << cluster_->Logs();
  EXPECT_EQ(testing::ReadFile(ckpt + "/" + ckpt::kClaimFile), *first + "\n");
  const std::map<std::string, std::string> before = Snapshot(ckpt);

  v1::Job later = RunLimited(MlpSpec(ckpt, 3));
  EXPECT_EQ(later.state(), v1::FAILED);
  EXPECT_NE(later.message().find("belongs to " + *first), std::string::npos) << later.message();
  EXPECT_EQ(Snapshot(ckpt), before);
}

}  // namespace
}  // namespace trainstep
