// Real processes on 127.0.0.1: the coordinator binary and two trainstep-worker processes
// (Gloo all-reduce between them) train the built-in models and a TorchScript file.
#include <ATen/ATen.h>
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/job_state.h"
#include "tests/integration/cluster_test.h"
#include "tests/integration/process_cluster.h"
#include "tests/integration/torchscript_fixture.h"
#include "worker/checkpoint/checkpoint_dir.h"

namespace trainstep {
namespace {

using testing::ProcessCluster;

int CountOf(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

class WorkerIntegrationTest : public testing::ClusterTest {
 protected:
  WorkerIntegrationTest() : ClusterTest("trainstep-wit-") {}

  // Submits, starts `workers` worker processes, waits for the end.
  v1::Job Run(const std::string& spec, int workers, absl::Duration timeout = absl::Seconds(120)) {
    absl::StatusOr<std::string> id = cluster_->Submit(spec);
    EXPECT_TRUE(id.ok()) << id.status();
    if (!id.ok()) return v1::Job();
    job_id_ = *id;
    for (int i = 0; i < workers; ++i) EXPECT_TRUE(cluster_->StartWorker(*id).ok());
    absl::StatusOr<v1::Job> job = cluster_->WaitForJob(*id, timeout);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? *job : v1::Job();
  }

  std::string job_id_;
};

// The mlp on synthetic regression with two ranks: every window commits with one all-reduce,
// checkpoints land on disk with the ids the coordinator assigned, and workers exit 0.
// Catches: a worker that never joins, a hang in the collective, checkpoints never acked.
TEST_F(WorkerIntegrationTest, MlpTwoWorkersCheckpoints) {
  const std::string ckpt = dir_ + "/ckpt";
  const v1::Job job =
      Run(absl::StrCat(
              R"({"name":"mlp","seed":3,"model":{"mlp":{"hidden":16}},)",
              R"("data":{"synthetic_regression":{"samples":96,"in_features":4}},)",
              R"("batch":{"micro_batch_size":4,"accumulation_steps":3},"workers":{"count":2},)",
              R"("optimizer":{"sgd":{"lr":0.05,"momentum":0.9}},"stop":{"max_updates":6},)",
              R"("checkpoint":{"dir":")", ckpt, R"(","every_updates":3,"keep_last":0}})"),
          2);
  ASSERT_EQ(job.state(), v1::SUCCEEDED) << job.message() << cluster_->Logs();
  absl::StatusOr<std::vector<v1::UpdateRecord>> log = cluster_->Updates(job_id_);
  ASSERT_TRUE(log.ok());
  ASSERT_EQ(log->size(), 6u);
  for (const v1::UpdateRecord& r : *log) {
    EXPECT_EQ(r.outcome(), "commit");
    EXPECT_EQ(r.allreduce_calls(), 1);
    EXPECT_EQ(r.micro_steps(), 6);           // 3 micro-batches on each of 2 ranks
    EXPECT_EQ(r.global_valid_tokens(), 24);  // samples of the window
    EXPECT_TRUE(std::isfinite(r.loss()));
  }
  EXPECT_LT(log->back().loss(), log->front().loss());
  // Checkpoints 0 (initial), 1 (update 3), 2 (update 6).
  EXPECT_EQ(job.progress().durable_checkpoint_id(), 2);
  absl::StatusOr<ckpt::LoadedCheckpoint> last = ckpt::ReadCheckpoint(ckpt, 2);
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_EQ(last->meta.optimizer_update_id, 6);
  EXPECT_TRUE(last->model.count("fc1.weight"));
  EXPECT_TRUE(last->optimizer.count("fc1.weight.momentum_buffer"));
  absl::StatusOr<ckpt::LoadedCheckpoint> first = ckpt::ReadCheckpoint(ckpt, 0);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_FALSE(first->model.at("fc1.weight").equal(last->model.at("fc1.weight")));
  for (int code : cluster_->WaitForWorkers(absl::Seconds(30)))
    EXPECT_EQ(code, 0) << cluster_->Logs();
}

// tiny_gpt on text in bf16 with accumulation: the loss falls and every window commits.
// Catches: autocast left on across calls, a broken causal LM loss, bf16 with a scaler.
TEST_F(WorkerIntegrationTest, TinyGptBf16OnText) {
  const std::string text = dir_ + "/text.txt";
  {
    std::ofstream out(text);
    for (int i = 0; i < 60; ++i) out << "the quick brown fox jumps over the lazy dog. ";
  }
  const v1::Job job =
      Run(absl::StrCat(
              R"({"name":"gpt","model":{"tiny_gpt":{"n_layer":1,"n_head":2,"d_model":32}},)",
              R"("data":{"text":{"paths":[")", text, R"("],"seq_len":32}},"precision":"bf16",)",
              R"("batch":{"micro_batch_size":2,"accumulation_steps":2},"workers":{"count":2},)",
              R"("optimizer":{"adamw":{"lr":0.01}},"stop":{"max_updates":12}})"),
          2);
  ASSERT_EQ(job.state(), v1::SUCCEEDED) << job.message() << cluster_->Logs();
  absl::StatusOr<std::vector<v1::UpdateRecord>> log = cluster_->Updates(job_id_);
  ASSERT_TRUE(log.ok());
  ASSERT_EQ(log->size(), 12u);
  for (const v1::UpdateRecord& r : *log) {
    EXPECT_EQ(r.outcome(), "commit");
    EXPECT_EQ(r.loss_scale(), 1.0);  // bf16: no scaler
  }
  EXPECT_LT(log->back().loss(), log->front().loss() * 0.8);
}

// A user's TorchScript file on JSONL with prompt masks: trained as it is (its own weights,
// its own parameter names), and the final checkpoint holds those names.
TEST_F(WorkerIntegrationTest, TorchScriptOnJsonl) {
  const std::string model = dir_ + "/lm.pt";
  testing::WriteTinyTorchScript(model);
  const std::string data = dir_ + "/train.jsonl";
  {
    std::ofstream out(data);
    for (int i = 0; i < 24; ++i) {
      const int n = 3 + i % 9;
      std::string ids, labels;
      for (int t = 0; t < n; ++t) {
        absl::StrAppend(&ids, t ? "," : "", 97 + (i + t) % 26);
        absl::StrAppend(&labels, t ? "," : "", t < 2 ? -100 : 97 + (i + t) % 26);
      }
      out << "{\"input_ids\":[" << ids << "],\"labels\":[" << labels << "]}\n";
    }
  }
  const std::string ckpt = dir_ + "/ckpt";
  const v1::Job job =
      Run(absl::StrCat(
              R"({"name":"ts","model":{"torchscript":{"path":")", model, R"("}},)",
              R"("data":{"jsonl":{"path":")", data, R"("}},)",
              R"("batch":{"micro_batch_size":2,"accumulation_steps":2},"workers":{"count":2},)",
              R"("optimizer":{"adamw":{"lr":0.02}},"stop":{"epochs":2},)",
              R"("checkpoint":{"dir":")", ckpt, R"(","every_updates":100}})"),
          2);
  ASSERT_EQ(job.state(), v1::SUCCEEDED) << job.message() << cluster_->Logs();
  absl::StatusOr<std::vector<v1::UpdateRecord>> log = cluster_->Updates(job_id_);
  ASSERT_TRUE(log.ok());
  EXPECT_EQ(log->size(), 6u);  // 24 samples / 8 per window × 2 epochs
  EXPECT_EQ(log->back().epoch(), 1);
  absl::StatusOr<std::optional<int64_t>> latest = ckpt::LatestCheckpoint(ckpt);
  ASSERT_TRUE(latest.ok() && latest->has_value());
  absl::StatusOr<ckpt::LoadedCheckpoint> c = ckpt::ReadCheckpoint(ckpt, **latest);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->meta.optimizer_update_id, 6);
  ASSERT_TRUE(c->model.count("emb"));
  ASSERT_TRUE(c->model.count("out"));
  ASSERT_TRUE(c->optimizer.count("emb.exp_avg"));
}

// tiny_gpt on a uint16 token file (nanoGPT's train.bin) with ids up to 999: the model is
// built with model.tiny_gpt.vocab_size rows, samples are seq_len + 1 ids (seq_len targets
// each), and the loss falls. Catches: the model still byte-level (an index error on id 999),
// a sample layout other than the documented one (the token count per window), the file not
// read at all.
TEST_F(WorkerIntegrationTest, TinyGptOnTokensFileWithLargerVocabulary) {
  const std::string data = dir_ + "/train.bin";
  {
    // A fixed sequence of 40 ids spread over 0..999, repeated: learnable.
    std::string bytes;
    for (int i = 0; i < 40 * 60; ++i) {
      const uint32_t id = (i % 40) * 25 + (i % 40 == 39 ? 24 : 0);  // 0, 25, ..., 999
      bytes.push_back(static_cast<char>(id & 0xff));
      bytes.push_back(static_cast<char>(id >> 8));
    }
    std::ofstream(data, std::ios::binary) << bytes;
  }
  const v1::Job job =
      Run(absl::StrCat(
              R"({"name":"tokens","model":{"tiny_gpt":{"n_layer":1,"n_head":2,"d_model":32,)",
              R"("vocab_size":1000}},"data":{"tokens":{"path":")", data,
              R"(","dtype":"uint16","seq_len":16},"shuffle":true},)",
              R"("batch":{"micro_batch_size":2,"accumulation_steps":2},"workers":{"count":2},)",
              R"("optimizer":{"adamw":{"lr":0.01}},"stop":{"max_updates":12}})"),
          2);
  ASSERT_EQ(job.state(), v1::SUCCEEDED) << job.message() << cluster_->Logs();
  EXPECT_EQ(job.spec().model().tiny_gpt().seq_len(), 17);  // resolved: seq_len + 1
  EXPECT_EQ(job.progress().dataset_samples(), (40 * 60 - 1) / 16);
  absl::StatusOr<std::vector<v1::UpdateRecord>> log = cluster_->Updates(job_id_);
  ASSERT_TRUE(log.ok());
  ASSERT_EQ(log->size(), 12u);
  for (const v1::UpdateRecord& r : *log) {
    EXPECT_EQ(r.outcome(), "commit");
    EXPECT_EQ(r.global_valid_tokens(), 2 * 2 * 2 * 16);  // 8 samples × seq_len targets
  }
  // An untrained model over 1000 ids starts near ln(1000) ≈ 6.9 nats (ln(256) ≈ 5.5).
  EXPECT_GT(log->front().loss(), 6.0);
  EXPECT_LT(log->back().loss(), log->front().loss() * 0.8);
}

// A TorchScript model over 50 token ids, with no vocab_size in the spec, trains: its
// vocabulary is read from the model. Catches the vocabulary guessed (256): "the model
// returned logits over 50 token ids, but the spec's model.torchscript.vocab_size is 256".
TEST_F(WorkerIntegrationTest, TorchScriptModelsOwnVocabularyTrains) {
  const std::string model = dir_ + "/lm50.pt";
  testing::WriteTinyTorchScript(model, /*dim=*/16, /*seed=*/7, /*vocab=*/50);
  const std::string data = dir_ + "/train.jsonl";
  std::ofstream(data) << "{\"input_ids\":[1,2,3,49]}\n{\"input_ids\":[5,6,7]}\n";
  const v1::Job job = Run(
      absl::StrCat(R"({"model":{"torchscript":{"path":")", model,
                   R"("}},"data":{"jsonl":{"path":")", data, R"("}},"stop":{"max_updates":2}})"),
      1, absl::Seconds(60));
  EXPECT_EQ(job.state(), v1::SUCCEEDED) << job.message() << cluster_->Logs();
  EXPECT_EQ(job.progress().optimizer_update_id(), 2);
}

// A spec's model.torchscript.vocab_size that disagrees with the model fails the job at load
// naming both, before any window. Catches the assertion unchecked, or checked only at the
// first forward.
TEST_F(WorkerIntegrationTest, TorchScriptVocabularyMismatchFailsAtLoad) {
  const std::string model = dir_ + "/lm.pt";
  testing::WriteTinyTorchScript(model);  // 256 classes
  const std::string data = dir_ + "/train.jsonl";
  std::ofstream(data) << "{\"input_ids\":[1,2,3,4]}\n{\"input_ids\":[5,6,7]}\n";
  const v1::Job job =
      Run(absl::StrCat(R"({"model":{"torchscript":{"path":")", model,
                       R"(","vocab_size":300}},"data":{"jsonl":{"path":")", data, R"("}}})"),
          1, absl::Seconds(60));
  EXPECT_EQ(job.state(), v1::FAILED);
  EXPECT_NE(
      job.message().find(absl::StrCat("model.torchscript.vocab_size is 300, but the model ", model,
                                      " has a vocabulary of 256 (its logits for one "
                                      "token)")),
      std::string::npos)
      << job.message();
  EXPECT_EQ(job.progress().generation(), 0) << "it failed after load, in a generation";
}

// A token file with an id the model has no row for fails before training, naming the model's
// vocabulary (its vocab_size attribute, 50). Catches the data checked against a guess (256
// lets id 60 through to the embedding) or only at the first forward.
TEST_F(WorkerIntegrationTest, TokenIdBeyondTheModelsVocabularyFailsBeforeTraining) {
  const std::string model = dir_ + "/lm50.pt";
  testing::WriteTinyTorchScript(model, 16, 7, 50, /*vocab_size_attribute=*/50);
  const std::string data = dir_ + "/train.bin";
  {
    std::string bytes;
    for (int i = 0; i < 64; ++i) {
      const uint16_t id = i == 40 ? 60 : i % 50;
      bytes.push_back(static_cast<char>(id & 0xff));
      bytes.push_back(static_cast<char>(id >> 8));
    }
    std::ofstream(data, std::ios::binary) << bytes;
  }
  const v1::Job job = Run(absl::StrCat(R"({"model":{"torchscript":{"path":")", model,
                                       R"("}},"data":{"tokens":{"path":")", data,
                                       R"(","dtype":"uint16","seq_len":8}}})"),
                          1, absl::Seconds(60));
  EXPECT_EQ(job.state(), v1::FAILED);
  EXPECT_NE(job.message().find(absl::StrCat(data,
                                            ": token 40 (byte offset 80) is 60, not a token id in "
                                            "0..49 (the model ",
                                            model, "'s vocab_size 50)")),
            std::string::npos)
      << job.message();
  EXPECT_EQ(job.progress().generation(), 0) << "it failed after load, in a generation";
}

// A job cancelled while its two workers train: each exits 0 with one INFO line saying the
// job was cancelled and by whom, and no ERROR. Catches the cancel taken as a worker failure
// (exit 1 with an ERROR): Kubernetes would restart the pods and alert.
TEST_F(WorkerIntegrationTest, CancelledJobEndsItsWorkersWithExitZero) {
  absl::StatusOr<std::string> id = cluster_->Submit(
      R"({"name":"long","model":{"mlp":{"hidden":16}},)"
      R"("data":{"synthetic_regression":{"samples":64,"in_features":4}},)"
      R"("batch":{"micro_batch_size":4,"accumulation_steps":2},"workers":{"count":2},)"
      R"("stop":{"max_updates":1000000}})");
  ASSERT_TRUE(id.ok()) << id.status();
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(cluster_->StartWorker(*id).ok());
  // Training, then cancelled: bounded polling, not a timed assertion.
  int64_t updates = 0;
  for (int i = 0; i < 1200 && updates < 3; ++i) {
    v1::GetJobRequest req;
    req.set_job_id(*id);
    v1::Job job;
    grpc::ClientContext ctx;
    if (cluster_->jobs()->GetJob(&ctx, req, &job).ok())
      updates = job.progress().optimizer_update_id();
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_GE(updates, 3) << cluster_->Logs();
  {
    v1::CancelJobRequest req;
    req.set_job_id(*id);
    v1::Job job;
    grpc::ClientContext ctx;
    ASSERT_TRUE(cluster_->jobs()->CancelJob(&ctx, req, &job).ok());
  }
  EXPECT_EQ(cluster_->WaitForWorkers(absl::Seconds(60)), (std::vector<int>{0, 0}))
      << cluster_->Logs();
  for (int i = 0; i < 2; ++i) {
    const std::string log = testing::ReadFile(absl::StrCat(dir_, "/worker-", i, ".log"));
    const std::string said =
        absl::StrCat(" INFO job ", *id, " was cancelled: cancelled by a client\n");
    EXPECT_EQ(CountOf(log, said), 1) << log;
    EXPECT_EQ(CountOf(log, " ERROR "), 0) << log;
  }
}

// A malformed JSONL line fails the job with file:line and the reason; workers exit, no hang.
TEST_F(WorkerIntegrationTest, BadDataFailsJobWithFileAndLine) {
  const std::string data = dir_ + "/bad.jsonl";
  {
    std::ofstream out(data);
    out << "{\"input_ids\":[1,2,3],\"labels\":[1,2,3]}\n";
    out << "{\"input_ids\":[1,2,3],\"labels\":[1,2]}\n";
  }
  const v1::Job job = Run(
      absl::StrCat(R"({"model":{"tiny_gpt":{"n_layer":1,"d_model":16}},"data":{"jsonl":{"path":")",
                   data, R"("}},"workers":{"count":2}})"),
      2, absl::Seconds(60));
  EXPECT_EQ(job.state(), v1::FAILED);
  EXPECT_NE(job.message().find(data + ":2"), std::string::npos) << job.message();
  for (int code : cluster_->WaitForWorkers(absl::Seconds(30))) EXPECT_NE(code, -2) << "hung";
}

}  // namespace
}  // namespace trainstep

namespace trainstep {
namespace {

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The job of the restart tests: an mlp, two workers, a checkpoint every 40 updates.
std::string ResumableSpec(const std::string& ckpt, int max_updates, int keep_last) {
  return absl::StrCat(
      R"({"seed":9,"model":{"mlp":{"hidden":32}},)",
      R"("data":{"synthetic_regression":{"samples":64,"in_features":4},"shuffle":true},)",
      R"("batch":{"micro_batch_size":2,"accumulation_steps":2},"workers":{"count":2},)",
      R"("optimizer":{"sgd":{"lr":0.02,"momentum":0.9}},"stop":{"max_updates":)", max_updates,
      R"(},"checkpoint":{"dir":")", ckpt, R"(","every_updates":40,"keep_last":)", keep_last, "}}");
}

// The model weights of `ckpt`'s latest checkpoint, which must hold update `updates`.
ckpt::TensorMap FinalWeights(const std::string& ckpt, int64_t updates) {
  absl::StatusOr<std::optional<int64_t>> latest = ckpt::LatestCheckpoint(ckpt);
  EXPECT_TRUE(latest.ok() && latest->has_value());
  if (!latest.ok() || !latest->has_value()) return {};
  absl::StatusOr<ckpt::LoadedCheckpoint> l = ckpt::ReadCheckpoint(ckpt, **latest);
  EXPECT_TRUE(l.ok()) << l.status();
  if (!l.ok()) return {};
  EXPECT_EQ(l->meta.optimizer_update_id, updates);
  return l->model;
}

void ExpectSameWeights(const ckpt::TensorMap& a, const ckpt::TensorMap& b) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, t] : a) {
    const double diff = at::sub(t, b.at(name)).abs().max().item().toDouble();
    EXPECT_LE(diff, 1e-6 * std::max(1.0, t.abs().max().item().toDouble())) << name;
  }
}

// Runs `spec` to its end with two fresh workers; false (with the logs) unless it SUCCEEDED.
bool RunToTheEnd(ProcessCluster& cluster, const std::string& spec) {
  absl::StatusOr<std::string> id = cluster.Submit(spec);
  EXPECT_TRUE(id.ok()) << id.status();
  if (!id.ok()) return false;
  for (int i = 0; i < 2; ++i) EXPECT_TRUE(cluster.StartWorker(*id).ok());
  absl::StatusOr<v1::Job> done = cluster.WaitForJob(*id, absl::Seconds(120));
  EXPECT_TRUE(done.ok() && done->state() == v1::SUCCEEDED) << cluster.Logs();
  return done.ok() && done->state() == v1::SUCCEEDED;
}

// Kills `workers` once checkpoint `durable` or a later one is durable, well between two
// checkpoints (every 40 updates) so that the rollback has windows to redo. Returns the job's
// progress at the kill; its optimizer_update_id is 0 if the job ended first or time ran out.
// Bounded by time, not by a count of polls: on a loaded machine the workers alone can take
// longer to start than a fixed number of polls lasts.
v1::JobProgress KillBetweenCheckpoints(ProcessCluster& cluster, const std::string& job_id,
                                       const std::vector<pid_t>& workers, int64_t durable) {
  for (const absl::Time give_up = absl::Now() + absl::Seconds(300); absl::Now() < give_up;) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::GetJobRequest req;
    req.set_job_id(job_id);
    v1::Job job;
    if (cluster.jobs()->GetJob(&ctx, req, &job).ok()) {
      if (IsTerminal(job.state())) break;
      const v1::JobProgress& p = job.progress();
      if (p.durable_checkpoint_id() >= durable && p.optimizer_update_id() % 40 >= 5 &&
          p.optimizer_update_id() % 40 <= 30) {
        for (pid_t w : workers) cluster.Kill(w);
        return p;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return v1::JobProgress();
}

// Every worker dies mid-run: the coordinator rolls the job back to its latest durable
// checkpoint (ids included), new workers restore it, and the final weights equal those of
// an uninterrupted run. Catches: ids not rolled back, optimizer state not restored, windows
// skipped or trained twice after a full restart.
TEST(WorkerRestartTest, AllWorkersLostResumesFromCheckpoint) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / absl::StrCat("trainstep-resume-", getpid()))
          .string();
  absl::StatusOr<std::unique_ptr<testing::ProcessCluster>> c =
      testing::ProcessCluster::Start(dir, /*worker_lease=*/absl::Seconds(1));
  ASSERT_TRUE(c.ok()) << c.status();
  testing::ProcessCluster& cluster = **c;

  // The uninterrupted run.
  ASSERT_TRUE(RunToTheEnd(cluster, ResumableSpec(dir + "/ckpt-a", 600, 0)));

  // The same job; both workers are killed once a checkpoint past update 0 is durable.
  absl::StatusOr<std::string> b = cluster.Submit(ResumableSpec(dir + "/ckpt-b", 600, 0));
  ASSERT_TRUE(b.ok());
  std::vector<pid_t> first;
  for (int i = 0; i < 2; ++i) first.push_back(*cluster.StartWorker(*b));
  const int64_t killed_at = KillBetweenCheckpoints(cluster, *b, first, 2).optimizer_update_id();
  ASSERT_GT(killed_at, 0) << "the job ended, or no checkpoint came, before the workers could be "
                             "killed";
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(cluster.StartWorker(*b).ok());
  absl::StatusOr<v1::Job> done_b = cluster.WaitForJob(*b, absl::Seconds(120));
  ASSERT_TRUE(done_b.ok() && done_b->state() == v1::SUCCEEDED) << cluster.Logs();
  EXPECT_GE(done_b->progress().generation(), 2);

  // The log shows the rollback: some window ids trained twice, in two generations.
  absl::StatusOr<std::vector<v1::UpdateRecord>> log = cluster.Updates(*b);
  ASSERT_TRUE(log.ok());
  std::set<int64_t> seen;
  bool repeated = false;
  for (const v1::UpdateRecord& r : *log) {
    if (r.outcome() == "commit" && !seen.insert(r.window_id()).second) repeated = true;
  }
  EXPECT_TRUE(repeated) << "no window was retrained after the rollback";

  ExpectSameWeights(FinalWeights(dir + "/ckpt-a", 600), FinalWeights(dir + "/ckpt-b", 600));
  if (!::testing::Test::HasFailure()) {
    c->reset();
    std::filesystem::remove_all(dir);
  }
}

// Every worker dies, and the checkpoint the job must roll back to is damaged on disk (a byte
// of its weights flipped); with keep_last 1 the ones before it are gone too. Each is found at
// load (a digest, a missing directory) and rolled back past, down to the initial weights, and
// the job still ends with the weights of an uninterrupted run. Catches: a damaged checkpoint
// loaded and trained on, a damaged or pruned one failing the job, one loaded again after it
// was found damaged.
TEST(WorkerRestartTest, DamagedAndPrunedCheckpointsAreRolledBackPast) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / absl::StrCat("trainstep-damaged-", getpid()))
          .string();
  absl::StatusOr<std::unique_ptr<testing::ProcessCluster>> c =
      testing::ProcessCluster::Start(dir, /*worker_lease=*/absl::Seconds(1));
  ASSERT_TRUE(c.ok()) << c.status();
  testing::ProcessCluster& cluster = **c;
  ASSERT_TRUE(RunToTheEnd(cluster, ResumableSpec(dir + "/ckpt-a", 200, 1)));

  const std::string ckpt = dir + "/ckpt-b";
  absl::StatusOr<std::string> b = cluster.Submit(ResumableSpec(ckpt, 200, 1));
  ASSERT_TRUE(b.ok());
  std::vector<pid_t> first;
  for (int i = 0; i < 2; ++i) first.push_back(*cluster.StartWorker(*b));
  const v1::JobProgress at_kill = KillBetweenCheckpoints(cluster, *b, first, 2);
  ASSERT_GT(at_kill.optimizer_update_id(), 0)
      << "the job ended, or no checkpoint came, before the workers could be killed";
  const std::string model =
      absl::StrCat(ckpt, "/ckpt-", at_kill.durable_checkpoint_id(), "/model.safetensors");
  std::string bytes = ReadAll(model);
  ASSERT_GT(bytes.size(), 16u) << model;
  bytes[bytes.size() - 5] ^= 0x10;
  std::ofstream(model, std::ios::binary | std::ios::trunc) << bytes;
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(cluster.StartWorker(*b).ok());
  absl::StatusOr<v1::Job> done_b = cluster.WaitForJob(*b, absl::Seconds(120));
  ASSERT_TRUE(done_b.ok() && done_b->state() == v1::SUCCEEDED) << cluster.Logs();
  // To the damaged checkpoint, past it to the pruned one before, ... down to the start.
  EXPECT_GE(done_b->progress().rollbacks(), 2);
  EXPECT_EQ(CountOf(ReadAll(dir + "/coordinator.log"),
                    absl::StrCat("checkpoint ", at_kill.durable_checkpoint_id(), " is damaged")),
            1)
      << cluster.Logs();

  ExpectSameWeights(FinalWeights(dir + "/ckpt-a", 200), FinalWeights(ckpt, 200));
  if (!::testing::Test::HasFailure()) {
    c->reset();
    std::filesystem::remove_all(dir);
  }
}

// A port on 127.0.0.1 that is not a coordinator: it answers with random bytes, accepts
// connections and says nothing, or is closed.
class BadPort {
 public:
  enum class Kind { kRandomBytes, kSilent, kClosed };

  explicit BadPort(Kind kind) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    socklen_t len = sizeof(addr);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    if (kind == Kind::kClosed) {
      close(fd_);
      fd_ = -1;
      return;
    }
    listen(fd_, 64);  // kSilent: the kernel completes the handshakes; nobody ever answers
    if (kind == Kind::kRandomBytes) {
      server_ = std::thread([this] {
        std::mt19937 rng(3);
        while (!stop_) {
          pollfd p{fd_, POLLIN, 0};
          if (poll(&p, 1, 100) <= 0) continue;
          const int c = accept(fd_, nullptr, nullptr);
          if (c < 0) continue;
          std::string junk(256, '\0');
          for (char& ch : junk) ch = static_cast<char>(rng());
          (void)send(c, junk.data(), junk.size(), MSG_NOSIGNAL);
          close(c);
        }
      });
    }
  }
  ~BadPort() {
    stop_ = true;
    if (server_.joinable()) server_.join();
    if (fd_ >= 0) close(fd_);
  }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread server_;
};

// Catches the probe's finding: a worker pointed at a port that speaks random bytes, a silent
// port or a closed port retried forever and logged nothing. It must log the failed attempts
// with their reason and exit 1 after --connect-timeout with a clear error.
TEST(WorkerProcessTest, UnreachableCoordinatorGivesUpAfterConnectTimeout) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / absl::StrCat("trainstep-badport-", getpid()))
          .string();
  std::filesystem::create_directories(dir);
  for (const auto& [kind, name] : std::vector<std::pair<BadPort::Kind, std::string>>{
           {BadPort::Kind::kRandomBytes, "random-bytes"},
           {BadPort::Kind::kSilent, "silent"},
           {BadPort::Kind::kClosed, "closed"}}) {
    SCOPED_TRACE(name);
    BadPort bad(kind);
    const std::string address = absl::StrCat("127.0.0.1:", bad.port());
    const std::string log = absl::StrCat(dir, "/", name, ".log");
    absl::StatusOr<int> code =
        testing::RunToExit({testing::BinDir() + "/trainstep-worker", "--coordinator", address,
                            "--connect-timeout", "2s", "--metrics-listen", "", "--name", name},
                           log, absl::Seconds(60));
    ASSERT_TRUE(code.ok()) << code.status();
    EXPECT_EQ(*code, 1) << ReadAll(log);
    const std::string text = ReadAll(log);
    EXPECT_NE(text.find(absl::StrCat("cannot reach the coordinator at ", address, " yet (")),
              std::string::npos)
        << text;
    EXPECT_NE(text.find(absl::StrCat("cannot register with the coordinator at ", address,
                                     ": no answer from the coordinator within 2s "
                                     "(--connect-timeout); last error: ")),
              std::string::npos)
        << text;
  }
  std::filesystem::remove_all(dir);
}

// The job of the two tests below: an mlp that runs for a while on two real workers.
std::string LongMlpSpec(int64_t max_updates) {
  return absl::StrCat(
      R"({"seed":4,"model":{"mlp":{"hidden":16}},)",
      R"("data":{"synthetic_regression":{"samples":64,"in_features":4}},)",
      R"("batch":{"micro_batch_size":2,"accumulation_steps":2},"workers":{"count":2},)",
      R"("optimizer":{"sgd":{"lr":0.01}},"stop":{"max_updates":)", max_updates, "}}");
}

// Polls the job (bounded) until `done` holds; returns the last state seen.
v1::Job WaitUntil(ProcessCluster& cluster, const std::string& job_id,
                  const std::function<bool(const v1::Job&)>& done) {
  v1::Job job;
  for (int i = 0; i < 6000; ++i) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::GetJobRequest req;
    req.set_job_id(job_id);
    if (cluster.jobs()->GetJob(&ctx, req, &job).ok() && done(job)) return job;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return job;
}

// Catches the probe's finding with real workers: a coordinator paused (SIGSTOP) for three
// leases declared every worker lost on SIGCONT and the job FAILED. Now it succeeds, with no
// worker lost and no window aborted.
TEST(WorkerProcessTest, CoordinatorPauseLongerThanTheLeaseDoesNotFailTheJob) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / absl::StrCat("trainstep-cpause-", getpid()))
          .string();
  absl::StatusOr<std::unique_ptr<ProcessCluster>> c =
      ProcessCluster::Start(dir, /*worker_lease=*/absl::Milliseconds(1000));
  ASSERT_TRUE(c.ok()) << c.status();
  ProcessCluster& cluster = **c;
  absl::StatusOr<std::string> job = cluster.Submit(LongMlpSpec(1500));
  ASSERT_TRUE(job.ok()) << job.status();
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(cluster.StartWorker(*job).ok());
  const v1::Job running = WaitUntil(
      cluster, *job, [](const v1::Job& j) { return j.progress().optimizer_update_id() >= 20; });
  ASSERT_GE(running.progress().optimizer_update_id(), 20) << cluster.Logs();
  ASSERT_EQ(running.state(), v1::RUNNING) << "the job ended before the pause";
  ASSERT_EQ(kill(cluster.coordinator_pid(), SIGSTOP), 0);
  std::this_thread::sleep_for(std::chrono::seconds(3));
  ASSERT_EQ(kill(cluster.coordinator_pid(), SIGCONT), 0);
  absl::StatusOr<v1::Job> done = cluster.WaitForJob(*job, absl::Seconds(300));
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->state(), v1::SUCCEEDED) << done->message() << cluster.Logs();
  EXPECT_EQ(done->progress().generation(), 1) << cluster.Logs();
  EXPECT_EQ(done->progress().windows_aborted(), 0);
  for (int code : cluster.WaitForWorkers(absl::Seconds(60))) EXPECT_EQ(code, 0) << cluster.Logs();
  if (!::testing::Test::HasFailure()) {
    c->reset();
    std::filesystem::remove_all(dir);
  }
}

// Catches the other half of the probe's finding: a worker declared lost (here: stopped for
// three leases) exited and failed the job. It registers again under a new identity, rejoins
// as a standby, takes the survivor's state and the job goes on.
TEST(WorkerProcessTest, WorkerDeclaredLostRegistersAgainAndRejoins) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / absl::StrCat("trainstep-wlost-", getpid()))
          .string();
  absl::StatusOr<std::unique_ptr<ProcessCluster>> c =
      ProcessCluster::Start(dir, /*worker_lease=*/absl::Milliseconds(1000));
  ASSERT_TRUE(c.ok()) << c.status();
  ProcessCluster& cluster = **c;
  absl::StatusOr<std::string> job = cluster.Submit(LongMlpSpec(400));
  ASSERT_TRUE(job.ok()) << job.status();
  std::vector<pid_t> workers;
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<pid_t> w = cluster.StartWorker(*job, {"--collective-timeout-ms", "30000"});
    ASSERT_TRUE(w.ok()) << w.status();
    workers.push_back(*w);
  }
  const v1::Job before = WaitUntil(
      cluster, *job, [](const v1::Job& j) { return j.progress().optimizer_update_id() >= 20; });
  ASSERT_GE(before.progress().optimizer_update_id(), 20) << cluster.Logs();
  ASSERT_EQ(before.state(), v1::RUNNING) << "the job ended before the pause";
  ASSERT_EQ(kill(workers[0], SIGSTOP), 0);
  // Stopped until the coordinator has declared it lost (the job then waits for a second
  // worker), not for a fixed time: a coordinator starved on a loaded machine renews leases
  // whose ticks came late, so three leases' time does not by itself make a worker lost.
  const v1::Job lost = WaitUntil(cluster, *job, [](const v1::Job& j) {
    return !j.progress().waiting().empty() || IsTerminal(j.state());
  });
  ASSERT_EQ(kill(workers[0], SIGCONT), 0);
  ASSERT_FALSE(lost.progress().waiting().empty()) << "never declared lost" << cluster.Logs();
  absl::StatusOr<v1::Job> done = cluster.WaitForJob(*job, absl::Seconds(300));
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->state(), v1::SUCCEEDED) << done->message() << cluster.Logs();
  EXPECT_GE(done->progress().generation(), 2) << cluster.Logs();  // it was lost, then rejoined
  const std::string log = ReadAll(dir + "/worker-0.log");
  EXPECT_NE(log.find("was declared lost"), std::string::npos) << log;
  EXPECT_NE(log.find("registered again as"), std::string::npos) << log;
  for (int code : cluster.WaitForWorkers(absl::Seconds(60))) EXPECT_EQ(code, 0) << cluster.Logs();
  if (!::testing::Test::HasFailure()) {
    c->reset();
    std::filesystem::remove_all(dir);
  }
}

}  // namespace
}  // namespace trainstep
