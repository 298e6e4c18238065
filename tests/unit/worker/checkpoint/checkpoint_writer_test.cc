// CheckpointWriter (worker/checkpoint/checkpoint_writer.h): rank 0's checkpoints are written in the
// background from a host copy taken at Submit, acknowledged only once on disk, one at a time,
// and a failed write fails the next Submit or Flush instead of being lost.
#include "worker/checkpoint/checkpoint_writer.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <torch/torch.h>

#include <filesystem>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/unit/coordinator/disk_full_env.h"

namespace trainstep {
namespace {

namespace fs = std::filesystem;

class CheckpointWriterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/trainstep-ckpt-writer-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }

  static ckpt::CheckpointMeta Meta(int64_t id) {
    ckpt::CheckpointMeta m;
    m.job_id = "job-1";
    m.checkpoint_id = id;
    m.optimizer_update_id = 10 * id;
    m.next_window_id = 10 * id + 1;
    return m;
  }

  // The callback the worker passes (AckCheckpoint): records what was acknowledged, and
  // checks the checkpoint is complete on disk by then.
  CheckpointWriter::OnWritten Recorder() {
    return [this](const ckpt::CheckpointMeta& meta, const std::string& path) {
      EXPECT_TRUE(fs::exists(path + "/meta.json")) << path;
      acked_.push_back(meta.checkpoint_id);
      return ack_status_;
    };
  }

  std::string dir_;
  std::vector<int64_t> acked_;
  absl::Status ack_status_;
};

// Catches: a checkpoint holding a later update's weights (the copy taken after the next step
// changed them in place), an acknowledgement sent before the files are durable, or lost.
TEST_F(CheckpointWriterTest, WritesTheValuesOfSubmitAndAcknowledgesInOrder) {
  HostCopy::Tensors model = {{"w", torch::full({3, 3}, 1.0f)}};
  HostCopy::Tensors optim = {{"w.exp_avg", torch::full({3, 3}, 0.5f)},
                             {"w.step", torch::scalar_tensor(1, torch::kLong)}};
  // The model's own file (a Hugging Face config.json) goes into every checkpoint.
  CheckpointWriter writer(dir_, /*keep_last=*/0, {{"config.json", "{}\n"}}, Recorder());
  ASSERT_TRUE(writer.Submit(Meta(1), model, optim).ok());
  writer.BeforeParametersChange();
  model["w"].add_(1);  // update 2, while checkpoint 1 may still be in flight
  optim["w.exp_avg"].add_(1);
  ASSERT_TRUE(writer.Submit(Meta(2), model, optim).ok());  // waits for checkpoint 1
  ASSERT_TRUE(writer.Flush().ok());
  EXPECT_EQ(acked_, (std::vector<int64_t>{1, 2}));
  for (int64_t id : {1, 2}) {
    absl::StatusOr<ckpt::LoadedCheckpoint> c = ckpt::ReadCheckpoint(dir_, id);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->meta.optimizer_update_id, 10 * id);
    EXPECT_TRUE(std::filesystem::exists(c->path + "/config.json"));
    EXPECT_TRUE(at::equal(c->model.at("w"), torch::full({3, 3}, static_cast<float>(id))));
    EXPECT_TRUE(at::equal(c->optimizer.at("w.exp_avg"),
                          torch::full({3, 3}, static_cast<float>(id) - 0.5f)));
  }
  EXPECT_TRUE(writer.Flush().ok());  // nothing in flight
}

// Catches: a write error swallowed by the background thread (the coordinator would wait for
// an acknowledgement that never comes, or the job would succeed without its checkpoint).
TEST_F(CheckpointWriterTest, AFailedWriteIsReturnedOnceAndStopsTheNext) {
  const std::string file = dir_ + "/not-a-dir";
  std::FILE* f = std::fopen(file.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fclose(f);
  CheckpointWriter writer(file, 0, {}, Recorder());
  HostCopy::Tensors model = {{"w", torch::ones({2})}};
  ASSERT_TRUE(writer.Submit(Meta(1), model, {}).ok());
  absl::Status next = writer.Submit(Meta(2), model, {});
  EXPECT_FALSE(next.ok());
  EXPECT_NE(next.message().find("not-a-dir"), std::string::npos) << next;
  EXPECT_TRUE(acked_.empty());
  EXPECT_TRUE(writer.Flush().ok()) << "checkpoint 2 was refused, not written";
  EXPECT_FALSE(fs::exists(file + "/ckpt-2"));
}

// Catches a full disk failing the job: with an OnFailed, the checkpoint that could not be
// written is reported, nothing of it is visible, the previous one stays, and the next one is
// written once there is room again.
TEST_F(CheckpointWriterTest, WithOnFailedAFullDiskSkipsTheCheckpointAndTheNextIsWritten) {
  DiskFullEnv disk(Env::Default());
  CheckpointWriter writer(dir_, 0, {}, Recorder(), &disk);
  std::vector<int64_t> failed;
  writer.set_on_failed([&failed](const ckpt::CheckpointMeta& meta, const absl::Status& why) {
    EXPECT_NE(why.message().find("No space left on device"), std::string::npos) << why;
    failed.push_back(meta.checkpoint_id);
  });
  const HostCopy::Tensors model = {{"w", torch::ones({2})}};
  ASSERT_TRUE(writer.Submit(Meta(1), model, {}).ok());
  ASSERT_TRUE(writer.Flush().ok());
  disk.SetFull(true);
  ASSERT_TRUE(writer.Submit(Meta(2), model, {}).ok());
  EXPECT_TRUE(writer.Flush().ok());
  EXPECT_EQ(failed, (std::vector<int64_t>{2}));
  disk.SetFull(false);
  ASSERT_TRUE(writer.Submit(Meta(3), model, {}).ok());
  EXPECT_TRUE(writer.Flush().ok());
  EXPECT_EQ(acked_, (std::vector<int64_t>{1, 3}));
  EXPECT_TRUE(fs::exists(dir_ + "/ckpt-1"));
  EXPECT_FALSE(fs::exists(dir_ + "/ckpt-2"));
  EXPECT_TRUE(fs::exists(dir_ + "/ckpt-3"));
}

// Catches: an acknowledgement that fails (coordinator unreachable) treated as success.
TEST_F(CheckpointWriterTest, AFailedAcknowledgementIsAnError) {
  ack_status_ = absl::UnavailableError("coordinator gone");
  CheckpointWriter writer(dir_, 0, {}, Recorder());
  ASSERT_TRUE(writer.Submit(Meta(3), {{"w", torch::ones({2})}}, {}).ok());
  absl::Status s = writer.Flush();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(acked_, (std::vector<int64_t>{3}));
}

}  // namespace
}  // namespace trainstep
