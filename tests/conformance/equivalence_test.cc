// Conformance, accumulation math: the real coordinator and trainstep-worker processes make
// the updates the single-process reference loop makes over the whole window (reference.h),
// whatever the number of workers W and accumulation steps K, on variable-length data, with a
// loss scale, with clipping, in bf16 and with a rank that has nothing to train.
// Parameters are compared after ≥ 5 updates as max|a − b| / max|b|.
#include <gtest/gtest.h>

#include <cmath>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "tests/conformance/harness.h"
#include "tests/conformance/reference.h"
#include "tests/integration/torchscript_fixture.h"

namespace trainstep::conformance {
namespace {

constexpr double kTolerance = 1e-5;

class EquivalenceTest : public ConformanceTest {
 protected:
  // Runs `c` and returns the parameters of its final checkpoint (every job checkpoints its
  // last committed update), after checking that it succeeded with `updates` commits.
  Params RunAndRead(const JobConfig& c, int64_t updates, JobRun* out = nullptr) {
    JobRun run = RunJob(c);
    EXPECT_EQ(run.job.state(), v1::SUCCEEDED) << run.job.message() << "\n" << cluster()->Logs();
    EXPECT_EQ(static_cast<int64_t>(Commits(run.updates).size()), updates);
    for (int code : run.worker_exit_codes) EXPECT_EQ(code, 0);
    int64_t update_id = -1;
    absl::StatusOr<Params> p = LatestCheckpointParams(c.checkpoint_dir, &update_id);
    EXPECT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(update_id, updates);
    if (out != nullptr) *out = std::move(run);
    return p.ok() ? *p : Params();
  }

  ReferenceRun Reference(const JobConfig& c, const ReferenceOptions& options = {}) {
    absl::StatusOr<ReferenceRun> r = RunReference(c.Json(), options);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : ReferenceRun();
  }

  // The log's loss and pre-clip norm of every commit equal the reference's (token-weighted
  // over the whole window, on the unscaled all-reduced gradient).
  static void ExpectLogMatches(const std::vector<v1::UpdateRecord>& commits,
                               const ReferenceRun& ref, double tolerance = kTolerance) {
    ASSERT_EQ(commits.size(), ref.updates.size());
    for (size_t i = 0; i < commits.size(); ++i) {
      const ReferenceUpdate& u = ref.updates[i];
      EXPECT_EQ(commits[i].window_id(), u.window_id);
      EXPECT_EQ(commits[i].global_valid_tokens(), u.units) << "window " << u.window_id;
      EXPECT_NEAR(commits[i].loss(), u.loss, tolerance * std::fabs(u.loss))
          << "window " << u.window_id;
      EXPECT_NEAR(commits[i].grad_norm_pre_clip(), u.grad_norm, tolerance * u.grad_norm)
          << "window " << u.window_id;
    }
  }

  // The seeds' norm probe on every commit of a run with a loss scaler: grad_norm_scaled /
  // grad_norm_pre_clip is the scale the window ran with (the one in force before its scaler
  // update: the previous record's loss_scale, init_scale for the first). A pre-clip norm
  // taken before unscaling, or a scaled norm taken after, gives a ratio of 1.
  static void ExpectScaledNormProbe(const std::vector<v1::UpdateRecord>& log, double init_scale,
                                    double tolerance = 1e-6) {
    double in_force = init_scale;
    int probed = 0;
    for (const v1::UpdateRecord& r : log) {
      if (r.outcome() == "commit") {
        EXPECT_TRUE(r.has_grad_norm_scaled()) << "window " << r.window_id();
        EXPECT_NEAR(r.grad_norm_scaled() / r.grad_norm_pre_clip(), in_force, tolerance * in_force)
            << "window " << r.window_id();
        ++probed;
      }
      if (r.outcome() != "abort") in_force = r.loss_scale();
    }
    EXPECT_GT(probed, 0);
  }
};

JobConfig MlpJob() {
  JobConfig c;
  c.model = R"({"mlp":{"hidden":16}})";
  c.data = R"({"synthetic_regression":{"samples":72,"in_features":4}})";
  c.epochs = 1;
  return c;
}

std::string TextModel(int d_model) {
  return absl::StrCat(R"({"tiny_gpt":{"n_layer":1,"n_head":2,"d_model":)", d_model, "}}");
}

std::string TextData(const std::string& path, int seq_len) {
  return absl::StrCat(R"({"text":{"paths":[")", path, R"("],"seq_len":)", seq_len, "}}");
}

// Case 1. fp32, W ∈ {1, 2, 4} × K ∈ {1, 3}, the same global batch of 12 samples: every run
// equals the reference to 1e-5 and the runs equal each other.
// Catches: a backward multiplier divided by K (or not by the global N), an all-reduce AVG
// on top of the 1/N (÷W twice) or no reduction at all, a rank normalising by its local
// count, micro-batches overwriting instead of accumulating gradients.
TEST_F(EquivalenceTest, Fp32WorkersByAccumulationEqualsReference) {
  struct Shape {
    int workers, accumulation, micro_batch;
  };
  const Shape shapes[] = {{1, 1, 12}, {1, 3, 4}, {2, 1, 6}, {2, 3, 2}, {4, 1, 3}, {4, 3, 1}};
  JobConfig base = MlpJob();
  base.micro_batch = 12;  // the reference needs only B = 12
  const ReferenceRun ref = Reference(base);
  ASSERT_EQ(ref.updates.size(), 6u);
  Params first;
  for (const Shape& s : shapes) {
    SCOPED_TRACE(absl::StrCat("W=", s.workers, " K=", s.accumulation));
    JobConfig c = base;
    c.workers = s.workers;
    c.accumulation = s.accumulation;
    c.micro_batch = s.micro_batch;
    c.checkpoint_dir = absl::StrCat(dir(), "/ckpt-w", s.workers, "-k", s.accumulation);
    JobRun run;
    const Params p = RunAndRead(c, 6, &run);
    for (const v1::UpdateRecord& r : run.updates) {
      EXPECT_EQ(r.micro_steps(), s.workers * s.accumulation);
      EXPECT_EQ(r.allreduce_calls(), 1);
    }
    ExpectLogMatches(Commits(run.updates), ref);
    const double diff = RelativeDifference(p, ref.final_params);
    std::cout << "W=" << s.workers << " K=" << s.accumulation << ": max|a-b|/max|b| vs reference "
              << diff << "\n";
    EXPECT_LE(diff, kTolerance);
    if (first.values.empty()) {
      first = p;
    } else {
      EXPECT_LE(RelativeDifference(p, first), kTolerance) << "depends on W or K";
    }
  }
}

// JSONL with lengths 1..200, prompt masks (the first quarter of each sample is -100), one
// fully masked sample: samples = 40, B = 8 (W 2 × K 2 × 2), 5 windows.
std::string VariableLengthJsonl() {
  std::string out;
  for (int i = 0; i < 40; ++i) {
    const int len = i == 0 ? 200 : i == 1 ? 1 : 1 + (i * 37) % 200;
    std::string ids, labels;
    for (int t = 0; t < len; ++t) {
      const int id = (3 * i + 7 * t + (t * t) % 11) % 256;
      const bool masked = i == 5 || t < len / 4;
      absl::StrAppend(&ids, t ? "," : "", id);
      absl::StrAppend(&labels, t ? "," : "", masked ? -100 : id);
    }
    absl::StrAppend(&out, R"({"input_ids":[)", ids, R"(],"labels":[)", labels, "]}\n");
  }
  return out;
}

// Case 2. Variable-length JSONL through a TorchScript model: equal to the token-mean
// reference (loss log and parameters); `microbatch_mean` measurably differs from it.
// Catches: a mean of per-micro-batch means (short samples up-weighted), prompt or padding
// labels counted in N, a per-rank instead of global N, a logged loss that is a mean of means.
TEST_F(EquivalenceTest, VariableLengthJsonlEqualsTokenMeanReference) {
  const std::string model = dir() + "/lm.pt";
  testing::WriteTinyTorchScript(model, /*dim=*/16, /*seed=*/7);
  const std::string data = dir() + "/train.jsonl";
  WriteFile(data, VariableLengthJsonl());
  JobConfig c;
  c.model = absl::StrCat(R"({"torchscript":{"path":")", model, R"("}})");
  c.data = absl::StrCat(R"({"jsonl":{"path":")", data, R"("}})");
  c.workers = 2;
  c.accumulation = 2;
  c.micro_batch = 2;
  c.epochs = 1;
  c.optimizer = R"({"sgd":{"lr":2.0,"momentum":0.9}})";
  c.checkpoint_dir = dir() + "/ckpt-tokens";
  const ReferenceRun ref = Reference(c);
  ASSERT_EQ(ref.updates.size(), 5u);

  JobRun run;
  const Params tokens = RunAndRead(c, 5, &run);
  ExpectLogMatches(Commits(run.updates), ref);
  const double diff = RelativeDifference(tokens, ref.final_params);
  EXPECT_LE(diff, kTolerance);

  JobConfig buggy = c;
  buggy.normalization = "microbatch_mean";
  buggy.checkpoint_dir = dir() + "/ckpt-microbatch-mean";
  const Params mean_of_means = RunAndRead(buggy, 5);
  const double bug = RelativeDifference(mean_of_means, ref.final_params);
  std::cout << "token-mean run vs reference: " << diff
            << "; microbatch_mean run vs reference: " << bug << " (" << bug / std::max(diff, 1e-12)
            << "x the token-mean run's error)\n";
  ::testing::Test::RecordProperty("microbatch_mean_relative_difference", std::to_string(bug));
  EXPECT_GT(bug, 100 * kTolerance) << "microbatch_mean should be detectably different";
}

// A tiny_gpt on byte text: 36 samples of 32 tokens, B = 6 (W 2 × K 3 × 1), 6 windows.
JobConfig TextJob(const std::string& dir, int d_model, int samples, int workers, int k, int mbs) {
  const std::string text = dir + "/text.txt";
  WriteFile(text, Corpus(static_cast<size_t>(samples) * 32));
  JobConfig c;
  c.model = TextModel(d_model);
  c.data = TextData(text, 32);
  c.workers = workers;
  c.accumulation = k;
  c.micro_batch = mbs;
  c.epochs = 1;
  c.optimizer = R"({"sgd":{"lr":0.5,"momentum":0.9}})";
  return c;
}

// Case 3. The loss scaler on with fp32 compute at S = 2^16: the same parameters as the
// unscaled run to 1e-6 (and as the reference), S in force in every record, and the norm
// probe: the norm before unscaling is S times the logged pre-clip norm.
// Catches: a systematic 1/S (never unscaled, or unscaled twice) or 1/K offset in the
// scaled path, the scale applied per micro-batch, the scale missing from the backward.
TEST_F(EquivalenceTest, LossScalerFp32EqualsUnscaledRun) {
  JobConfig unscaled = TextJob(dir(), 16, 36, 2, 3, 1);
  unscaled.checkpoint_dir = dir() + "/ckpt-unscaled";
  JobConfig scaled = unscaled;
  scaled.loss_scaler = R"({"enabled":true,"init_scale":65536})";
  scaled.checkpoint_dir = dir() + "/ckpt-scaled";
  const ReferenceRun ref = Reference(unscaled);
  ASSERT_EQ(ref.updates.size(), 6u);

  JobRun plain_run, scaled_run;
  const Params plain = RunAndRead(unscaled, 6, &plain_run);
  const Params with_scale = RunAndRead(scaled, 6, &scaled_run);
  for (const v1::UpdateRecord& r : plain_run.updates) EXPECT_EQ(r.loss_scale(), 1.0);
  for (const v1::UpdateRecord& r : scaled_run.updates) EXPECT_EQ(r.loss_scale(), 65536.0);
  ExpectScaledNormProbe(scaled_run.updates, 65536.0);
  for (const v1::UpdateRecord& r : plain_run.updates) EXPECT_FALSE(r.has_grad_norm_scaled());
  ASSERT_EQ(plain_run.updates.size(), scaled_run.updates.size());
  for (size_t i = 0; i < plain_run.updates.size(); ++i) {
    const double a = scaled_run.updates[i].grad_norm_pre_clip();
    const double b = plain_run.updates[i].grad_norm_pre_clip();
    EXPECT_NEAR(a, b, 1e-6 * b) << "window " << i + 1 << ": unscaled norm differs";
  }
  const double diff = RelativeDifference(with_scale, plain);
  std::cout << "S=2^16 vs unscaled: " << diff
            << "; unscaled vs reference: " << RelativeDifference(plain, ref.final_params) << "\n";
  EXPECT_LE(diff, 1e-6);
  EXPECT_LE(RelativeDifference(plain, ref.final_params), kTolerance);
  ExpectLogMatches(Commits(scaled_run.updates), ref);
}

// Case 4 (through the processes). At S = 2^16 with max_grad_norm small enough to clip every
// update: the logged pre-clip norm is the unscaled one and the coefficient equals
// clip_grad_norm_'s on the reference; parameters equal the reference's.
// Catches: clipping (or the norm) in scaled space, clipping before the all-reduce on a
// local norm, the coefficient not applied, clipping applied twice.
TEST_F(EquivalenceTest, ClipAfterUnscaleEqualsClipGradNorm) {
  JobConfig c = MlpJob();
  c.workers = 2;
  c.accumulation = 3;
  c.micro_batch = 2;
  c.max_grad_norm = 0.05;
  c.loss_scaler = R"({"enabled":true,"init_scale":65536})";
  c.checkpoint_dir = dir() + "/ckpt";
  const ReferenceRun ref = Reference(c);
  ASSERT_EQ(ref.updates.size(), 6u);
  JobRun run;
  const Params p = RunAndRead(c, 6, &run);
  const std::vector<v1::UpdateRecord> commits = Commits(run.updates);
  ASSERT_EQ(commits.size(), 6u);
  int clipped = 0;
  for (size_t i = 0; i < commits.size(); ++i) {
    const ReferenceUpdate& u = ref.updates[i];
    EXPECT_NEAR(commits[i].grad_norm_pre_clip(), u.grad_norm, kTolerance * u.grad_norm);
    EXPECT_NEAR(commits[i].clip_coef(), u.clip_coef, kTolerance * u.clip_coef);
    EXPECT_NEAR(commits[i].grad_norm_post_clip(), std::min(u.grad_norm, 0.05), kTolerance);
    if (u.clip_coef < 1.0) ++clipped;
  }
  EXPECT_GE(clipped, 4) << "max_grad_norm too large to exercise clipping";
  ExpectScaledNormProbe(run.updates, 65536.0);
  EXPECT_LE(RelativeDifference(p, ref.final_params), kTolerance);
}

// Case 10. bf16 autocast: no scaler (loss_scale 1 in every record), the loss falls, and the
// parameters stay within bf16 tolerance (2e-2 relative) of the fp32 reference after 6 updates.
// Catches: a scaler (or an unscale by a stale S) left on the bf16 path, autocast leaking
// into the loss or optimizer (fp32 master weights lost), a broken bf16 backward.
TEST_F(EquivalenceTest, Bf16WithoutScalerTracksFp32) {
  JobConfig c = TextJob(dir(), 32, 48, 2, 2, 2);
  c.precision = "bf16";
  c.checkpoint_dir = dir() + "/ckpt";
  JobConfig fp32 = c;
  fp32.precision = "fp32";
  const ReferenceRun ref = Reference(fp32);
  ASSERT_EQ(ref.updates.size(), 6u);
  JobRun run;
  const Params p = RunAndRead(c, 6, &run);
  for (const v1::UpdateRecord& r : run.updates) EXPECT_EQ(r.loss_scale(), 1.0);
  const std::vector<v1::UpdateRecord> commits = Commits(run.updates);
  ASSERT_EQ(commits.size(), 6u);
  EXPECT_LT(commits.back().loss(), commits.front().loss()) << "loss did not fall";
  const double diff = RelativeDifference(p, ref.final_params);
  std::cout << "bf16 vs fp32 reference: " << diff << "; loss " << commits.front().loss() << " → "
            << commits.back().loss() << "\n";
  EXPECT_LE(diff, 2e-2);
  for (size_t i = 0; i < commits.size(); ++i) {
    EXPECT_NEAR(commits[i].loss(), ref.updates[i].loss, 2e-2 * ref.updates[i].loss);
  }
}

// Case 10b. fp16 on CUDA: autocast in fp16, the loss scaler at 2^10 and the CUDA unscale
// (_amp_foreach_non_finite_check_and_unscale_), one worker per visible GPU (at most 2; NCCL
// when 2): within fp16 tolerance (1e-2 relative) of the fp32 CPU reference, the scale in
// force in every record, the logged loss the reference's. Skips, saying so, without a GPU.
// Catches: the fp16 path off (silently fp32), an unscale missing or applied twice on CUDA
// (a 2^10 or 2^-10 offset), the scaler left out of the backward, gradients summed on the
// wrong stream (garbage in the all-reduce).
TEST_F(EquivalenceTest, CudaFp16WithScalerTracksFp32Reference) {
  const int gpus = WorkerCudaDevices();
  if (gpus == 0) GTEST_SKIP() << "no CUDA device visible to a CUDA-built worker: fp16 needs one";
  const int workers = gpus >= 2 ? 2 : 1;
  JobConfig c = TextJob(dir(), 32, 48, workers, 6 / workers, 2);
  c.precision = "fp16";
  c.loss_scaler = R"({"enabled":true,"init_scale":1024})";
  c.checkpoint_dir = dir() + "/ckpt";
  JobConfig fp32 = c;
  fp32.precision = "fp32";
  fp32.loss_scaler = "";
  const ReferenceRun ref = Reference(fp32);
  ASSERT_EQ(ref.updates.size(), 4u);
  std::vector<std::vector<std::string>> flags;
  for (int i = 0; i < workers; ++i) flags.push_back({absl::StrCat("--device=cuda:", i)});
  JobRun run = RunJob(c.Json(), workers, flags);
  EXPECT_EQ(run.job.state(), v1::SUCCEEDED) << run.job.message() << "\n" << cluster()->Logs();
  for (const v1::UpdateRecord& r : run.updates) EXPECT_EQ(r.loss_scale(), 1024.0);
  const std::vector<v1::UpdateRecord> commits = Commits(run.updates);
  ASSERT_EQ(commits.size(), 4u);
  int64_t update_id = -1;
  absl::StatusOr<Params> p = LatestCheckpointParams(c.checkpoint_dir, &update_id);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(update_id, 4);
  const double diff = RelativeDifference(*p, ref.final_params);
  std::cout << "fp16 on " << workers << " GPU(s) vs fp32 CPU reference: " << diff << "\n";
  EXPECT_LE(diff, 1e-2);
  for (size_t i = 0; i < commits.size(); ++i) {
    EXPECT_NEAR(commits[i].loss(), ref.updates[i].loss, 1e-2 * ref.updates[i].loss);
  }
  ExpectScaledNormProbe(run.updates, 1024.0, 1e-5);
}

// Case 11. W = 4, B = 8, 42 samples: the 6th window holds 2 samples, so ranks 2 and 3 get
// none; they still enter the all-reduce (with zero gradients) and the result equals the
// reference normalised by the 2 real samples.
// Catches: an idle rank skipping the collective (hang or ABORT), gradients not zero-filled
// (undefined tensors in the all-reduce), normalising the tail by the nominal batch or by a
// local count of 0 (NaN).
TEST_F(EquivalenceTest, RankWithoutSamplesInTailStillTakesPart) {
  JobConfig c = MlpJob();
  c.data = R"({"synthetic_regression":{"samples":42,"in_features":4}})";
  c.workers = 4;
  c.accumulation = 1;
  c.micro_batch = 2;
  c.checkpoint_dir = dir() + "/ckpt";
  const ReferenceRun ref = Reference(c);
  ASSERT_EQ(ref.updates.size(), 6u);
  EXPECT_EQ(ref.updates.back().units, 2);
  JobRun run;
  const Params p = RunAndRead(c, 6, &run);
  ASSERT_EQ(run.updates.size(), 6u);
  const v1::UpdateRecord& tail = run.updates.back();
  EXPECT_EQ(tail.outcome(), "commit");
  EXPECT_EQ(tail.world_size(), 4);
  EXPECT_EQ(tail.micro_steps(), 2);  // ranks 0 and 1 one micro-batch each, ranks 2, 3 none
  EXPECT_EQ(tail.global_valid_tokens(), 2);
  EXPECT_EQ(tail.allreduce_calls(), 1);
  ExpectLogMatches(Commits(run.updates), ref);
  EXPECT_LE(RelativeDifference(p, ref.final_params), kTolerance);
}

}  // namespace
}  // namespace trainstep::conformance
