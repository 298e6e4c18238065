// Conformance, the step protocol: skips, ids, schedules, collectives, tails, param groups and
// desync, through the real coordinator and trainstep-worker processes, with parameters held
// against the single-process reference loop (reference.h) where the case trains.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iostream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "tests/conformance/harness.h"
#include "tests/conformance/reference.h"
#include "tests/integration/torchscript_fixture.h"

namespace trainstep::conformance {
namespace {

constexpr double kTolerance = 1e-5;

class ProtocolTest : public ConformanceTest {
 protected:
  JobRun RunOk(const JobConfig& c, int64_t commits) {
    JobRun run = RunJob(c);
    EXPECT_EQ(run.job.state(), v1::SUCCEEDED) << run.job.message() << "\n" << cluster()->Logs();
    EXPECT_EQ(static_cast<int64_t>(Commits(run.updates).size()), commits);
    for (int code : run.worker_exit_codes) EXPECT_EQ(code, 0);
    return run;
  }

  ReferenceRun Reference(const JobConfig& c, const ReferenceOptions& options = {}) {
    absl::StatusOr<ReferenceRun> r = RunReference(c.Json(), options);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : ReferenceRun();
  }

  static Params Latest(const std::string& ckpt_dir, int64_t expect_update) {
    int64_t update_id = -1;
    absl::StatusOr<Params> p = LatestCheckpointParams(ckpt_dir, &update_id);
    EXPECT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(update_id, expect_update);
    return p.ok() ? *p : Params();
  }

  static Params Checkpoint(const std::string& ckpt_dir, int64_t id, int64_t expect_update) {
    int64_t update_id = -1;
    absl::StatusOr<Params> p = CheckpointParams(ckpt_dir, id, &update_id);
    EXPECT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(update_id, expect_update) << "checkpoint " << id;
    return p.ok() ? *p : Params();
  }
};

JobConfig MlpJob(int samples) {
  JobConfig c;
  c.model = R"({"mlp":{"hidden":16}})";
  c.data = absl::StrCat(R"({"synthetic_regression":{"samples":)", samples, R"(,"in_features":4}})");
  c.epochs = 1;
  return c;
}

// Case 5. Overflow injected in window 3 (rank 0 writes +inf after its last backward):
// window 3 is SKIP(OVERFLOW); the parameters after it are those of the reference that never
// saw window 3; the scale backs off exactly once (×0.5) and then holds; scheduler_step,
// optimizer_update_id and checkpoint_id do not move; window 4's gradient is clean (its norm
// equals the reference's).
// Catches: stepping on an overflow window, an inf residue leaking into the next window (no
// zero_grad on skip), the scale backed off per micro-batch or per rank, a skipped window
// advancing the scheduler / update id / checkpoint id.
TEST_F(ProtocolTest, OverflowWindowIsSkippedOnce) {
  JobConfig c = MlpJob(72);
  c.workers = 2;
  c.accumulation = 3;
  c.micro_batch = 2;
  c.loss_scaler = R"({"enabled":true,"init_scale":65536,"growth_interval":2000})";
  c.nonfinite_windows = {3};
  c.checkpoint_dir = dir() + "/ckpt";
  c.checkpoint_every = 1;
  ReferenceOptions skip3;
  skip3.skip_windows = {3};
  const ReferenceRun ref = Reference(c, skip3);
  const ReferenceRun no_skip = Reference(c);
  ASSERT_EQ(ref.updates.size(), 5u);
  const JobRun run = RunOk(c, 5);
  ASSERT_EQ(run.updates.size(), 6u);
  const v1::UpdateRecord& before = run.updates[1];
  const v1::UpdateRecord& skipped = run.updates[2];
  const v1::UpdateRecord& after = run.updates[3];
  EXPECT_EQ(before.outcome(), "commit");
  EXPECT_EQ(skipped.window_id(), 3);
  EXPECT_EQ(skipped.outcome(), "skip");
  EXPECT_EQ(skipped.reason(), "OVERFLOW");
  EXPECT_EQ(before.loss_scale(), 65536.0);
  EXPECT_EQ(skipped.loss_scale(), 32768.0) << "backoff exactly once";
  for (size_t i = 3; i < run.updates.size(); ++i) EXPECT_EQ(run.updates[i].loss_scale(), 32768.0);
  EXPECT_EQ(skipped.optimizer_update_id(), before.optimizer_update_id());
  EXPECT_EQ(skipped.scheduler_step(), before.scheduler_step());
  EXPECT_EQ(skipped.checkpoint_id(), before.checkpoint_id());
  EXPECT_EQ(skipped.cumulative_tokens(), before.cumulative_tokens());
  EXPECT_EQ(after.outcome(), "commit");
  EXPECT_EQ(after.optimizer_update_id(), before.optimizer_update_id() + 1);
  EXPECT_EQ(after.scheduler_step(), before.scheduler_step() + 1);
  EXPECT_TRUE(std::isfinite(after.grad_norm_pre_clip()));
  EXPECT_NEAR(after.grad_norm_pre_clip(), ref.updates[2].grad_norm,
              kTolerance * ref.updates[2].grad_norm)
      << "window 4's gradient is not clean";

  // Checkpoints: 0 initial, 1 and 2 after windows 1 and 2, 3 after window 4 (no checkpoint
  // for the skipped window).
  const std::string ckpt = c.checkpoint_dir;
  EXPECT_LE(RelativeDifference(Checkpoint(ckpt, 2, 2), ref.after_update[1]), kTolerance);
  const Params after_skip = Checkpoint(ckpt, 3, 3);
  EXPECT_LE(RelativeDifference(after_skip, ref.after_update[2]), kTolerance)
      << "window 3 changed the parameters";
  EXPECT_GT(RelativeDifference(after_skip, no_skip.after_update[2]), 1e-3)
      << "the check cannot tell a skipped window from a committed one";
  EXPECT_LE(RelativeDifference(Latest(ckpt, 5), ref.final_params), kTolerance);
}

// Case 6. Scheduler alignment: 2K micro-batches with K = 4 → scheduler_step 2; the same with
// window 1 overflowing → 1; and with warmup-cosine, the logged lr of every committed update is
// the closed form at its scheduler step, skips not counted, and training follows it.
// Catches: the scheduler stepped per micro-batch or per window (skips included), the lr read
// at the wrong step, the worker ignoring the coordinator's lr.
TEST_F(ProtocolTest, SchedulerFollowsCommittedUpdates) {
  JobConfig two = MlpJob(16);
  two.accumulation = 4;
  two.micro_batch = 2;  // W 1 × K 4 × 2 = 8 samples a window → 2 windows, 8 micro-batches
  const JobRun clean = RunOk(two, 2);
  EXPECT_EQ(clean.job.progress().scheduler_step(), 2);
  EXPECT_EQ(clean.job.progress().optimizer_update_id(), 2);
  int64_t micro = 0;
  for (const v1::UpdateRecord& r : clean.updates) micro += r.micro_steps();
  EXPECT_EQ(micro, 8);

  JobConfig skip = two;
  skip.loss_scaler = R"({"enabled":true})";
  skip.nonfinite_windows = {1};
  const JobRun skipped = RunOk(skip, 1);
  EXPECT_EQ(skipped.job.progress().scheduler_step(), 1);
  EXPECT_EQ(skipped.job.progress().optimizer_update_id(), 1);
  ASSERT_EQ(skipped.updates.size(), 2u);
  EXPECT_EQ(skipped.updates[0].reason(), "OVERFLOW");
  EXPECT_EQ(skipped.updates[0].scheduler_step(), 0);

  JobConfig cosine = MlpJob(56);  // 7 windows of 8
  cosine.accumulation = 4;
  cosine.micro_batch = 2;
  cosine.epochs.reset();
  cosine.max_updates = 6;
  cosine.loss_scaler = R"({"enabled":true})";
  cosine.nonfinite_windows = {3};
  cosine.optimizer = R"({"sgd":{"lr":0.2,"momentum":0.9}})";
  cosine.schedule =
      R"({"warmup_cosine":{"warmup_updates":2,"total_updates":6,"min_lr_ratio":0.1}})";
  cosine.checkpoint_dir = dir() + "/ckpt";
  ReferenceOptions skip3;
  skip3.skip_windows = {3};
  const ReferenceRun ref = Reference(cosine, skip3);
  ASSERT_EQ(ref.updates.size(), 6u);
  const JobRun run = RunOk(cosine, 6);
  const std::vector<v1::UpdateRecord> commits = Commits(run.updates);
  ASSERT_EQ(commits.size(), 6u);
  for (size_t k = 0; k < commits.size(); ++k) {
    const double want = 0.2 * ReferenceLrFactor(cosine.Json(), static_cast<int64_t>(k));
    EXPECT_NEAR(commits[k].learning_rate(), want, 1e-12) << "update " << k + 1;
    EXPECT_EQ(commits[k].scheduler_step(), static_cast<int64_t>(k) + 1);
  }
  EXPECT_EQ(run.updates[2].outcome(), "skip");
  EXPECT_EQ(run.updates[2].scheduler_step(), 2);
  EXPECT_EQ(run.job.progress().scheduler_step(), 6);
  EXPECT_LE(RelativeDifference(Latest(cosine.checkpoint_dir, 6), ref.final_params), kTolerance);
}

// The buckets of DDP's rule (≤ 25 MiB each, in reverse parameter order, a bigger tensor
// alone) for fp32 tensors of these element counts, given in parameter order.
int Buckets(const std::vector<int64_t>& numels) {
  const int64_t cap = 25 * 1024 * 1024;
  int buckets = 0;
  int64_t bytes = 0;
  for (auto it = numels.rbegin(); it != numels.rend(); ++it) {
    const int64_t n = *it;
    if (buckets == 0 || bytes + 4 * n > cap) {
      ++buckets;
      bytes = 0;
    }
    bytes += 4 * n;
  }
  return buckets;
}

// Case 7. Communication probe: one all-reduce call per window (one bucket for a small model)
// for K = 1, 4, 8, and for a model of > 25 MiB of fp32 parameters exactly its bucket count
// (2), again independent of K.
// Catches: a collective per micro-batch (no no_sync), one call per tensor, a forward outside
// the no_sync region syncing, buckets that depend on K.
TEST_F(ProtocolTest, OneAllReducePerBucketPerWindow) {
  for (int k : {1, 4, 8}) {
    SCOPED_TRACE(absl::StrCat("small mlp, K=", k));
    JobConfig c = MlpJob(64);
    c.workers = 2;
    c.accumulation = k;
    c.micro_batch = 1;
    c.epochs.reset();
    c.max_updates = 2;
    const JobRun run = RunOk(c, 2);
    for (const v1::UpdateRecord& r : run.updates) {
      EXPECT_EQ(r.allreduce_calls(), 1);
      EXPECT_EQ(r.micro_steps(), 2 * k);
    }
  }
  // mlp 104 → 65536 → 1: 6.9 M parameters, 26.5 MiB; fc1.weight alone is 26 MiB.
  const int64_t hidden = 65536, in = 104;
  const int buckets = Buckets({hidden * in, hidden, hidden, 1});
  ASSERT_EQ(buckets, 2);
  for (int k : {1, 4}) {
    SCOPED_TRACE(absl::StrCat("big mlp, K=", k));
    JobConfig c = MlpJob(32);
    c.model = absl::StrCat(R"({"mlp":{"hidden":)", hidden, "}}");
    c.data = absl::StrCat(R"({"synthetic_regression":{"samples":32,"in_features":)", in, "}}");
    c.workers = 2;
    c.accumulation = k;
    c.micro_batch = 1;
    c.epochs.reset();
    c.max_updates = 2;
    const JobRun run = RunOk(c, 2);
    for (const v1::UpdateRecord& r : run.updates) EXPECT_EQ(r.allreduce_calls(), buckets);
  }
}

// Case 8a. 44 samples, B = 8: `dynamic` trains 6 windows, the 6th with its 4 real samples
// (normalised by 4) and marked `tail_window`, `drop` trains 5 and records the 4 samples it
// left out; both equal the reference of their policy.
// Catches: a tail normalised by the nominal batch (or K), a tail trained under `drop`, a tail
// lost under `dynamic`, a dropped tail the log does not name, or names wrongly.
TEST_F(ProtocolTest, TailDynamicVersusDrop) {
  JobConfig dynamic = MlpJob(44);
  dynamic.workers = 2;
  dynamic.accumulation = 2;
  dynamic.micro_batch = 2;
  dynamic.tail = "dynamic";
  dynamic.checkpoint_dir = dir() + "/ckpt-dynamic";
  JobConfig drop = dynamic;
  drop.tail = "drop";
  drop.checkpoint_dir = dir() + "/ckpt-drop";
  const ReferenceRun ref_dynamic = Reference(dynamic);
  const ReferenceRun ref_drop = Reference(drop);
  ASSERT_EQ(ref_dynamic.updates.size(), 6u);
  ASSERT_EQ(ref_drop.updates.size(), 5u);

  const JobRun d = RunOk(dynamic, 6);
  ASSERT_EQ(d.updates.size(), 6u);
  EXPECT_EQ(d.updates.back().global_valid_tokens(), 4);
  EXPECT_EQ(d.updates.back().micro_steps(), 2);
  // The log marks the short window, and counts micro-batches cumulatively (2 ranks × 2).
  for (size_t i = 0; i < d.updates.size(); ++i) {
    EXPECT_EQ(d.updates[i].tail_window(), i == 5) << "window " << i + 1;
    EXPECT_FALSE(d.updates[i].has_dropped_tail());
    EXPECT_EQ(d.updates[i].micro_step_id(), std::min<int64_t>(4 * (i + 1), 22));
  }
  EXPECT_EQ(d.job.progress().dropped_samples(), 0);
  const Params pd = Latest(dynamic.checkpoint_dir, 6);
  EXPECT_LE(RelativeDifference(pd, ref_dynamic.final_params), kTolerance);

  const JobRun r = RunOk(drop, 5);
  ASSERT_EQ(r.updates.size(), 5u);
  for (const v1::UpdateRecord& u : r.updates) EXPECT_EQ(u.global_valid_tokens(), 8);
  // The epoch's record says which samples it left out: positions 40..43, unshuffled.
  for (size_t i = 0; i + 1 < r.updates.size(); ++i) EXPECT_FALSE(r.updates[i].has_dropped_tail());
  ASSERT_TRUE(r.updates.back().has_dropped_tail());
  const v1::DroppedTail& dropped = r.updates.back().dropped_tail();
  EXPECT_EQ(dropped.epoch(), 0);
  EXPECT_EQ(dropped.samples(), 4);
  EXPECT_EQ(dropped.first_position(), 40);
  EXPECT_THAT(dropped.sample_ids(), ::testing::ElementsAre(40, 41, 42, 43));
  EXPECT_EQ(r.job.progress().dropped_samples(), 4);
  EXPECT_EQ(r.job.progress().last_dropped_tail().SerializeAsString(), dropped.SerializeAsString());
  const Params pr = Latest(drop.checkpoint_dir, 5);
  EXPECT_LE(RelativeDifference(pr, ref_drop.final_params), kTolerance);
  EXPECT_GT(RelativeDifference(pd, pr), 1e-4) << "the tail window made no difference";
}

// 24 JSONL samples, B = 4: window 3 (samples 8..11) has no trainable token (all labels
// -100, or a single token), the others have prompt masks and lengths 2..30.
std::string JsonlWithEmptyWindow() {
  std::string out;
  for (int i = 0; i < 24; ++i) {
    const bool empty = i >= 8 && i < 12;
    const int len = empty && i == 9 ? 1 : 2 + (i * 7) % 29;
    std::string ids, labels;
    for (int t = 0; t < len; ++t) {
      const int id = (5 * i + 3 * t) % 256;
      absl::StrAppend(&ids, t ? "," : "", id);
      absl::StrAppend(&labels, t ? "," : "", empty || t < len / 3 ? -100 : id);
    }
    absl::StrAppend(&out, R"({"input_ids":[)", ids, R"(],"labels":[)", labels, "]}\n");
  }
  return out;
}

// Case 8b. A window with zero valid tokens ends as SKIP(EMPTY_WINDOW), nothing in the log or
// the job is NaN or infinite (every double field checked), and training around it equals
// the reference, which skips it too.
// Catches: 0/0 = NaN from normalising by N = 0 (in the loss, the log or the parameters),
// an empty window committed or counted as an update, a crash on empty micro-batches.
TEST_F(ProtocolTest, EmptyWindowSkipsWithoutNan) {
  const std::string model = dir() + "/lm.pt";
  testing::WriteTinyTorchScript(model, 16, 5);
  const std::string data = dir() + "/train.jsonl";
  WriteFile(data, JsonlWithEmptyWindow());
  JobConfig c;
  c.model = absl::StrCat(R"({"torchscript":{"path":")", model, R"("}})");
  c.data = absl::StrCat(R"({"jsonl":{"path":")", data, R"("}})");
  c.workers = 2;
  c.micro_batch = 2;
  c.epochs = 1;
  c.optimizer = R"({"sgd":{"lr":1.0,"momentum":0.9}})";
  c.checkpoint_dir = dir() + "/ckpt";
  const ReferenceRun ref = Reference(c);
  ASSERT_EQ(ref.empty_windows, std::vector<int64_t>{3});
  ASSERT_EQ(ref.updates.size(), 5u);
  const JobRun run = RunOk(c, 5);
  ASSERT_EQ(run.updates.size(), 6u);
  const v1::UpdateRecord& empty = run.updates[2];
  EXPECT_EQ(empty.window_id(), 3);
  EXPECT_EQ(empty.outcome(), "skip");
  EXPECT_EQ(empty.reason(), "EMPTY_WINDOW");
  EXPECT_EQ(empty.global_valid_tokens(), 0);
  EXPECT_EQ(empty.optimizer_update_id(), run.updates[1].optimizer_update_id());
  for (const v1::UpdateRecord& r : run.updates) {
    std::string bad;
    EXPECT_TRUE(AllDoublesFinite(r, &bad)) << "window " << r.window_id() << ": " << bad;
  }
  std::string bad;
  EXPECT_TRUE(AllDoublesFinite(run.job, &bad)) << bad;
  EXPECT_LE(RelativeDifference(Latest(c.checkpoint_dir, 5), ref.final_params), kTolerance);
}

// Case 9. Frozen prefixes and two param groups on tiny_gpt: frozen tensors are bitwise the
// initial ones; "blocks" steps at 0.1× and "head" at 3× the base lr, as the reference built
// with the same groups does (and unlike one without the groups).
// Catches: frozen parameters in the optimizer (weight decay / momentum moving them), a
// group's lr_scale ignored or applied to every group, the lr set on group 0 only.
TEST_F(ProtocolTest, ParamGroupsAndFrozenPrefixes) {
  const std::string text = dir() + "/text.txt";
  WriteFile(text, Corpus(48 * 16));
  JobConfig c;
  c.model = R"({"tiny_gpt":{"n_layer":1,"n_head":2,"d_model":16}})";
  c.data = absl::StrCat(R"({"text":{"paths":[")", text, R"("],"seq_len":16}})");
  c.workers = 2;
  c.accumulation = 2;
  c.micro_batch = 2;
  c.epochs = 1;
  c.optimizer =
      R"({"sgd":{"lr":0.3,"momentum":0.9,"weight_decay":0.1},)"
      R"("param_groups":[{"prefix":"blocks","lr_scale":0.1},{"prefix":"head","lr_scale":3}],)"
      R"("frozen_prefixes":["pos_emb","blocks.0.ln1"]})";
  c.checkpoint_dir = dir() + "/ckpt";
  const std::vector<std::string> frozen = {"pos_emb", "blocks.0.ln1"};
  const ReferenceRun ref = Reference(c);
  ASSERT_EQ(ref.updates.size(), 6u);
  JobConfig no_groups = c;
  no_groups.optimizer = R"({"sgd":{"lr":0.3,"momentum":0.9,"weight_decay":0.1},)"
                        R"("frozen_prefixes":["pos_emb","blocks.0.ln1"]})";
  const ReferenceRun ref_no_groups = Reference(no_groups);

  RunOk(c, 6);
  const Params initial = Checkpoint(c.checkpoint_dir, 0, 0);
  const Params final_params = Latest(c.checkpoint_dir, 6);
  const Params frozen_initial = Select(initial, frozen);
  ASSERT_EQ(frozen_initial.values.size(), 3u);  // pos_emb.weight, ln1.weight, ln1.bias
  EXPECT_TRUE(BitwiseEqual(Select(final_params, frozen), frozen_initial)) << "frozen moved";
  EXPECT_TRUE(BitwiseEqual(Select(ref.initial, frozen), frozen_initial));
  EXPECT_GT(RelativeDifference(Select(final_params, frozen, false), Select(initial, frozen, false)),
            1e-3);
  const double diff = RelativeDifference(final_params, ref.final_params);
  EXPECT_LE(diff, kTolerance);
  for (const char* group : {"blocks.0.attn", "head"}) {
    const double ungrouped = RelativeDifference(Select(final_params, {group}),
                                                Select(ref_no_groups.final_params, {group}));
    EXPECT_GT(ungrouped, 100 * kTolerance) << group << " stepped with the default lr";
  }
}

// Case 12. A worker started with --debug-perturb-grad-window 2 reports a gradient norm that
// differs from its peer's: window 2 ends ABORT(DESYNC) and never commits (retries desync
// again, and after 3 the job fails naming the divergence).
// Catches: per-rank norms never compared (diverged replicas continue silently), rank 0's
// norm trusted for everyone, a desync committed or skipped instead of aborted.
TEST_F(ProtocolTest, DesyncAbortsInsteadOfCommitting) {
  JobConfig c = MlpJob(64);
  c.workers = 2;
  c.micro_batch = 4;
  c.epochs.reset();
  c.max_updates = 4;
  const JobRun run = RunJob(c.Json(), 2, {{}, {"--debug-perturb-grad-window=2"}});
  bool aborted = false;
  for (const v1::UpdateRecord& r : run.updates) {
    if (r.window_id() != 2) continue;
    EXPECT_NE(r.outcome(), "commit") << "a desynchronised window committed";
    EXPECT_NE(r.outcome(), "skip");
    if (r.outcome() == "abort" && r.reason() == "DESYNC") aborted = true;
  }
  EXPECT_TRUE(aborted) << "no ABORT(DESYNC) for window 2\n" << cluster()->Logs();
  ASSERT_FALSE(run.updates.empty());
  EXPECT_EQ(run.updates.front().outcome(), "commit");
  EXPECT_EQ(run.job.state(), v1::FAILED);
  EXPECT_TRUE(absl::StrContains(run.job.message(), "diverged")) << run.job.message();
  EXPECT_EQ(run.job.progress().optimizer_update_id(), 1);
}

}  // namespace
}  // namespace trainstep::conformance
