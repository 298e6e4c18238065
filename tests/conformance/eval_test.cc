// Conformance, held-out evaluation (spec.eval): the eval loss the real coordinator and
// trainstep-worker processes record equals the loss recomputed apart from the worker
// (reference.h ReferenceEvalLoss: one forward per sample, fp32, Σ over valid tokens ÷ their
// count) on the weights of the checkpoint of the same update, at every evaluated update;
// the final checkpoint's meta.json carries the last one.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
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

// A tiny_gpt on `samples` × 32 bytes of text, W 2, micro-batches of 2, evaluated every 2
// updates on HeldOutJsonl() (`eval_extra`: more members of `eval`).
JobConfig HeldOutJob(const std::string& dir, int samples, const std::string& eval_extra = "") {
  const std::string text = dir + "/train.txt";
  WriteFile(text, Corpus(static_cast<size_t>(samples) * 32));
  const std::string held_out = dir + "/held-out.jsonl";
  WriteFile(held_out, HeldOutJsonl());
  JobConfig c;
  c.model = R"({"tiny_gpt":{"n_layer":1,"n_head":2,"d_model":16}})";
  c.data = absl::StrCat(R"({"text":{"paths":[")", text, R"("],"seq_len":32}})");
  c.workers = 2;
  c.micro_batch = 2;
  c.eval = absl::StrCat(R"({"data":{"jsonl":{"path":")", held_out, R"("}},"every_updates":2)",
                        eval_extra.empty() ? "" : ",", eval_extra, "}");
  return c;
}

class EvalTest : public ConformanceTest {};

// Catches: an eval loss that is a mean of per-micro-batch or per-rank means, counts masked
// labels, runs on the weights before the update, covers a different set than max_batches
// says, lands on another update's record, or is missing from the final checkpoint's meta.json.
TEST_F(EvalTest, RecordedEvalLossEqualsAnIndependentRecomputation) {
  // 11 micro-batches of 2 of the 30 held-out samples: ranks get 6 and 5.
  JobConfig c = HeldOutJob(dir(), 30, R"("max_batches":11)");
  c.max_updates = 5;
  c.optimizer = R"({"sgd":{"lr":0.5,"momentum":0.9}})";
  c.checkpoint_dir = dir() + "/ckpt";
  c.checkpoint_every = 1;  // a checkpoint of every update: the weights each eval saw

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
    // The check can tell token weighting from a mean of means on this data (an untrained
    // model's token losses are all near ln 256, so the gap is small, but 10× the tolerance).
    EXPECT_GT(std::fabs(ref->mean_of_micro_batch_means - ref->loss), 10 * kTolerance * ref->loss);
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

// A rank exits in the middle of the evaluation of update 2 (--debug-exit-in-eval, after it
// computed its share, before it reported). Like a window: nothing is recorded from the one
// rank that did report, the survivor's eval barrier answers ABORTED, and the next generation
// (the survivor and a standby) evaluates the same weights again before its first window.
// Catches: a half-recorded evaluation (one rank's sum over the global count), an evaluation
// silently dropped after the failure, or one recorded twice.
TEST_F(EvalTest, RankLostDuringEvalIsEvaluatedAgainByTheNextGeneration) {
  JobConfig c = HeldOutJob(dir(), 24);
  c.max_updates = 3;
  c.optimizer = R"({"sgd":{"lr":0.5}})";
  const JobRun clean = RunJob(c);
  ASSERT_EQ(clean.job.state(), v1::SUCCEEDED) << clean.job.message();
  std::map<int64_t, double> clean_eval;
  for (const v1::UpdateRecord& r : Commits(clean.updates)) {
    if (r.has_eval_loss()) clean_eval[r.optimizer_update_id()] = r.eval_loss();
  }
  ASSERT_EQ(clean_eval.size(), 2u);  // updates 2 and 3 (the last)

  testing::ProcessCluster* cl = cluster();
  absl::StatusOr<std::string> job_id = cl->Submit(c.Json());
  ASSERT_TRUE(job_id.ok()) << job_id.status();
  ASSERT_TRUE(cl->StartWorker(*job_id, {"--debug-exit-in-eval=2"}).ok());
  ASSERT_TRUE(cl->StartWorker(*job_id).ok());
  // The standby starts once both others hold a rank, so the exiting worker is a member.
  const absl::Time give_up = absl::Now() + absl::Seconds(60);
  int active = 0;
  while (active < 2 && absl::Now() < give_up) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::ListWorkersRequest req;
    req.set_job_id(*job_id);
    v1::ListWorkersResponse resp;
    if (cl->jobs()->ListWorkers(&ctx, req, &resp).ok()) {
      active = 0;
      for (const v1::WorkerInfo& w : resp.workers()) active += w.state() == v1::ACTIVE;
    }
    if (active < 2) absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_EQ(active, 2) << cl->Logs();
  ASSERT_TRUE(cl->StartWorker(*job_id).ok());
  absl::StatusOr<v1::Job> job = cl->WaitForJob(*job_id, absl::Seconds(180));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->state(), v1::SUCCEEDED) << job->message() << "\n" << cl->Logs();
  EXPECT_GE(job->progress().generation(), 2);  // the failure formed a new generation
  const std::vector<int> codes = cl->WaitForWorkers(absl::Seconds(60));
  EXPECT_NE(std::find(codes.begin(), codes.end(), 3), codes.end()) << "nobody exited in eval";

  absl::StatusOr<std::vector<v1::UpdateRecord>> log = cl->Updates(*job_id);
  ASSERT_TRUE(log.ok()) << log.status();
  std::map<int64_t, double> evals;
  for (const v1::UpdateRecord& r : *log) {
    if (!r.has_eval_loss()) continue;
    EXPECT_TRUE(evals.emplace(r.optimizer_update_id(), r.eval_loss()).second)
        << "update " << r.optimizer_update_id() << " evaluated twice";
  }
  ASSERT_EQ(evals.size(), 2u);
  for (const auto& [update, loss] : clean_eval) {
    EXPECT_NEAR(evals[update], loss, kTolerance * std::fabs(loss)) << "update " << update;
  }
  EXPECT_EQ(job->progress().last_eval_update_id(), 3);
}

}  // namespace
}  // namespace trainstep::conformance
