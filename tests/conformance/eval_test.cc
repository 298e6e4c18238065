// Conformance, held-out evaluation (spec.eval): the eval loss the real coordinator and
// trainstep-worker processes record equals the loss recomputed apart from the worker
// (reference.h ReferenceEvalLoss: one forward per sample, fp32, Σ over valid tokens ÷ their
// count) on the weights of the checkpoint of the same update, at every evaluated update;
// the final checkpoint's meta.json carries the last one.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "tests/conformance/harness.h"
#include "tests/conformance/reference.h"
#include "worker/checkpoint/checkpoint_dir.h"

namespace trainstep::conformance {
namespace {

constexpr double kTolerance = 1e-5;

// 30 held-out samples of 2..31 tokens (they fit the model's 32), the first quarter of each
// masked (-100) and sample 3 masked entirely: short and long samples weigh by their tokens.
std::string HeldOutJsonl() {
  std::string out;
  for (int i = 0; i < 30; ++i) {
    const int len = 2 + (i * 7) % 30;
    std::string ids, labels;
    for (int t = 0; t < len; ++t) {
      const int id = (5 * i + 11 * t + (t * t) % 13) % 256;
      const bool masked = i == 3 || t < len / 4;
      absl::StrAppend(&ids, t ? "," : "", id);
      absl::StrAppend(&labels, t ? "," : "", masked ? -100 : id);
    }
    absl::StrAppend(&out, R"({"input_ids":[)", ids, R"(],"labels":[)", labels, "]}\n");
  }
  return out;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

class EvalTest : public ConformanceTest {};

// Catches: an eval loss that is a mean of per-micro-batch or per-rank means, counts masked
// labels, runs on the weights before the update, covers a different set than max_batches
// says, lands on another update's record, or is missing from the final checkpoint's meta.json.
TEST_F(EvalTest, RecordedEvalLossEqualsAnIndependentRecomputation) {
  const std::string text = dir() + "/train.txt";
  WriteFile(text, Corpus(30 * 32));
  const std::string held_out = dir() + "/held-out.jsonl";
  WriteFile(held_out, HeldOutJsonl());
  JobConfig c;
  c.model = R"({"tiny_gpt":{"n_layer":1,"n_head":2,"d_model":16}})";
  c.data = absl::StrCat(R"({"text":{"paths":[")", text, R"("],"seq_len":32}})");
  c.workers = 2;
  c.micro_batch = 2;
  c.max_updates = 5;
  c.optimizer = R"({"sgd":{"lr":0.5,"momentum":0.9}})";
  c.checkpoint_dir = dir() + "/ckpt";
  c.checkpoint_every = 1;  // a checkpoint of every update: the weights each eval saw
  // 11 micro-batches of 2 of the 30 samples: ranks get 6 and 5, the last is whole.
  c.eval = absl::StrCat(R"({"data":{"jsonl":{"path":")", held_out,
                        R"("}},"every_updates":2,"max_batches":11})");

  const JobRun run = RunJob(c);
  ASSERT_EQ(run.job.state(), v1::SUCCEEDED) << run.job.message() << "\n" << cluster()->Logs();
  for (int code : run.worker_exit_codes) EXPECT_EQ(code, 0);
  const std::vector<v1::UpdateRecord> commits = Commits(run.updates);
  ASSERT_EQ(commits.size(), 5u);

  // Evaluated: every 2nd update and the last one; nothing else.
  std::map<int64_t, v1::UpdateRecord> evaluated;
  for (const v1::UpdateRecord& r : commits) {
    if (r.has_eval_loss()) evaluated[r.optimizer_update_id()] = r;
  }
  ASSERT_EQ(evaluated.size(), 3u);
  ASSERT_TRUE(evaluated.count(2) && evaluated.count(4) && evaluated.count(5));

  for (const auto& [update, record] : evaluated) {
    int64_t checkpoint_update = -1;
    absl::StatusOr<Params> params = CheckpointParams(c.checkpoint_dir, update, &checkpoint_update);
    ASSERT_TRUE(params.ok()) << params.status();
    ASSERT_EQ(checkpoint_update, update);
    absl::StatusOr<ReferenceEval> ref = ReferenceEvalLoss(c.Json(), *params);
    ASSERT_TRUE(ref.ok()) << ref.status();
    EXPECT_EQ(record.eval_valid_tokens(), ref->tokens) << "update " << update;
    EXPECT_NEAR(record.eval_loss(), ref->loss, kTolerance * std::fabs(ref->loss))
        << "update " << update;
    // The check can tell token weighting from a mean of means on this data.
    EXPECT_GT(std::fabs(ref->mean_of_micro_batch_means - ref->loss), 100 * kTolerance * ref->loss);
  }
  // Training moved the weights: the evaluations differ.
  EXPECT_NE(evaluated[2].eval_loss(), evaluated[5].eval_loss());

  EXPECT_DOUBLE_EQ(run.job.progress().last_eval_loss(), evaluated[5].eval_loss());
  EXPECT_EQ(run.job.progress().last_eval_update_id(), 5);
  absl::StatusOr<ckpt::CheckpointMeta> meta =
      ckpt::CheckpointMetaFromJson(ReadAll(c.checkpoint_dir + "/ckpt-5/meta.json"));
  ASSERT_TRUE(meta.ok()) << meta.status();
  ASSERT_TRUE(meta->eval_loss.has_value());
  EXPECT_DOUBLE_EQ(*meta->eval_loss, evaluated[5].eval_loss());
  EXPECT_EQ(meta->eval_update_id, 5);
  // A checkpoint between evaluations carries the latest one before it.
  absl::StatusOr<ckpt::CheckpointMeta> meta3 =
      ckpt::CheckpointMetaFromJson(ReadAll(c.checkpoint_dir + "/ckpt-3/meta.json"));
  ASSERT_TRUE(meta3.ok()) << meta3.status();
  EXPECT_EQ(meta3->eval_update_id, 2);
}

}  // namespace
}  // namespace trainstep::conformance
