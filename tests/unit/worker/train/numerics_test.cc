// The worker's numerics in isolation: loss sums and token counts, the backward multiplier,
// unscale + non-finite check, the global norm, clipping, the optimizer's groups and state,
// and a replica whose K accumulated micro-steps equal one full-window step.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>

#include "core/spec.h"
#include "worker/data/collate.h"
#include "worker/data/dataset.h"
#include "worker/train/amp.h"
#include "worker/train/loss.h"
#include "worker/train/optim.h"
#include "worker/train/replica.h"

namespace trainstep {
namespace {

v1::JobSpec Spec(const std::string& json) {
  absl::StatusOr<v1::JobSpec> s = ParseAndResolveJobSpec(json);
  EXPECT_TRUE(s.ok()) << s.status();
  return *s;
}

data::Sample Tokens(std::vector<int32_t> ids, std::vector<int32_t> labels = {}) {
  data::Sample s;
  s.input_ids = ids;
  s.labels = labels.empty() ? ids : labels;
  return s;
}

// Catches: mean instead of sum, the causal shift off by one, -100 counted as a target.
TEST(LossTest, TokenLossIsASumOverShiftedUnmaskedLabels) {
  data::Dataset d =
      data::Dataset::FromSamples({Tokens({1, 2, 3, 4}, {1, -100, 3, 4}), Tokens({5, 6})});
  data::MicroBatch mb = data::Collate(d, {0, 1});
  EXPECT_EQ(mb.valid_tokens, 2 + 1);  // labels[1:] not -100: {3,4} and {6}
  MicroBatchTensors t = ToTensors(mb, /*token_level=*/true, at::kCPU);
  at::Tensor logits = at::randn({2, 4, 8});
  at::Tensor sum = LossSum(logits, t, true);
  // By hand: CE at (row 0, pos 1 -> 3), (row 0, pos 2 -> 4), (row 1, pos 0 -> 6).
  auto ce = [&](int r, int p, int target) {
    return -at::log_softmax(logits[r][p], 0)[target].item<double>();
  };
  EXPECT_NEAR(sum.item<double>(), ce(0, 1, 3) + ce(0, 2, 4) + ce(1, 0, 6), 1e-5);
}

// Catches: regression loss normalised per micro-batch instead of summed per sample.
TEST(LossTest, SampleLossIsSumOfPerSampleMeans) {
  data::Sample a, b;
  a.features = {1, 2};
  a.targets = {0, 0};
  b.features = {3, 4};
  b.targets = {1, 1};
  data::Dataset d = data::Dataset::FromSamples({a, b});
  MicroBatchTensors t = ToTensors(data::Collate(d, {0, 1}), /*token_level=*/false, at::kCPU);
  EXPECT_EQ(t.units, 2);
  at::Tensor pred = at::tensor({1.0f, 1.0f, 3.0f, 1.0f}).view({2, 2});
  // sample 0: mean(1,1)=1; sample 1: mean(4,0)=2.
  EXPECT_NEAR(LossSum(pred, t, false).item<double>(), 3.0, 1e-6);
}

// Catches: dividing by K or by world size, or by a local count (docs/numerics.md, rules 3, 15).
TEST(LossTest, BackwardMultiplierUsesOnlyTheGlobalCount) {
  EXPECT_DOUBLE_EQ(BackwardMultiplier(v1::Loss::tokens, 8.0, 1000, 100, 4, 2), 8.0 / 1000);
  EXPECT_DOUBLE_EQ(BackwardMultiplier(v1::Loss::samples, 1.0, 64, 8, 4, 2), 1.0 / 64);
  // The demonstrated bug: each micro-batch's mean weighs 1/(K·W) whatever its size.
  EXPECT_DOUBLE_EQ(BackwardMultiplier(v1::Loss::microbatch_mean, 1.0, 1000, 100, 4, 2),
                   1.0 / (100 * 4 * 2));
}

// The worked numbers of docs/numerics.md: micro-gradients 1, 2, 3 with K = 3 and S = 8
// accumulate to 16; unscaled once: 2.0. Forgetting /K would give 6; clipping at 1 in scaled
// space 1/8.
TEST(AmpTest, WorkedExampleUnscalesOnce) {
  at::Tensor grad = at::zeros({1});
  for (double g : {1.0, 2.0, 3.0}) grad += 8.0 * g / 3.0;
  EXPECT_NEAR(grad.item<double>(), 16.0, 1e-6);
  std::vector<at::Tensor> grads = {grad};
  EXPECT_FALSE(UnscaleAndCheck(grads, 1.0 / 8.0));
  EXPECT_NEAR(grads[0].item<double>(), 2.0, 1e-6);
  EXPECT_NEAR(GlobalNorm(grads), 2.0, 1e-6);
}

// Catches: a non-finite value in any tensor missed, or the unscale skipped after it.
TEST(AmpTest, UnscaleFindsInfAndNaNAnywhere) {
  for (float bad : {std::numeric_limits<float>::infinity(), std::nanf("")}) {
    std::vector<at::Tensor> grads = {at::ones({3}), at::ones({2, 2})};
    grads[1][1][0] = bad;
    EXPECT_TRUE(UnscaleAndCheck(grads, 0.5));
    EXPECT_NEAR(grads[0][0].item<float>(), 0.5f, 1e-7);  // the others still unscaled
  }
  std::vector<at::Tensor> clean = {at::full({4}, 3.0f)};
  EXPECT_FALSE(UnscaleAndCheck(clean, 1.0));
}

// Catches: a norm that differs from clip_grad_norm_'s definition (per-tensor norms combined).
TEST(AmpTest, GlobalNormMatchesClipGradNorm) {
  torch::manual_seed(0);
  std::vector<at::Tensor> params = {torch::randn({5, 3}, torch::requires_grad()),
                                    torch::randn({7}, torch::requires_grad())};
  for (auto& p : params) p.mutable_grad() = torch::randn_like(p) * 10;
  std::vector<at::Tensor> grads = {params[0].grad().clone(), params[1].grad().clone()};
  const double ours = GlobalNorm(grads);
  const double theirs = torch::nn::utils::clip_grad_norm_(params, 1e9);
  EXPECT_NEAR(ours, theirs, 1e-5 * theirs);
}

// fp16 without CUDA is refused with what to do instead.
TEST(AmpTest, Fp16OnCpuIsRefused) {
  absl::Status s = CheckPrecision(v1::JobSpec::fp16, at::kCPU);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("bf16"), std::string::npos);
  EXPECT_TRUE(CheckPrecision(v1::JobSpec::bf16, at::kCPU).ok());
}

// Catches: frozen parameters left in the optimizer, groups with the wrong lr, a prefix
// that matches nothing silently ignored.
TEST(OptimTest, GroupsAndFrozenPrefixes) {
  const v1::JobSpec spec = Spec(R"({"model":{"mlp":{"in_features":2,"hidden":3}},
      "data":{"synthetic_regression":{"in_features":2}},
      "optimizer":{"sgd":{"lr":0.1},"param_groups":[{"prefix":"fc2.","lr_scale":0.5}],
                   "frozen_prefixes":["fc1.bias"]}})");
  NamedTensors params = {{"fc1.weight", torch::zeros({3, 2}, torch::requires_grad())},
                         {"fc1.bias", torch::zeros({3}, torch::requires_grad())},
                         {"fc2.weight", torch::zeros({1, 3}, torch::requires_grad())}};
  absl::StatusOr<std::unique_ptr<Optim>> o = Optim::Build(spec, params);
  ASSERT_TRUE(o.ok()) << o.status();
  ASSERT_EQ((*o)->trainable().size(), 2u);
  EXPECT_EQ((*o)->frozen(), std::vector<std::string>{"fc1.bias"});
  EXPECT_FALSE(params[1].second.requires_grad());
  (*o)->ZeroGrad();
  for (const TrainableParam& p : (*o)->trainable()) p.tensor.mutable_grad().fill_(1.0);
  (*o)->SetLearningRate(0.1);
  (*o)->Step();
  EXPECT_NEAR(params[0].second[0][0].item<double>(), -0.1, 1e-7);   // default group
  EXPECT_NEAR(params[2].second[0][0].item<double>(), -0.05, 1e-7);  // lr × 0.5
  EXPECT_EQ(params[1].second[0].item<double>(), 0.0);               // frozen

  const v1::JobSpec bad = Spec(R"({"model":{"mlp":{}},"data":{"synthetic_regression":{}},
      "optimizer":{"frozen_prefixes":["nope."]}})");
  absl::StatusOr<std::unique_ptr<Optim>> b = Optim::Build(bad, params);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(b.status().message().find("optimizer.frozen_prefixes[0]"), std::string::npos);
}

// Catches: AdamW state lost or misattributed on checkpoint/broadcast restore.
TEST(OptimTest, AdamStateRoundTrips) {
  const v1::JobSpec spec = Spec(R"({"model":{"mlp":{}},"data":{"synthetic_regression":{}},
      "optimizer":{"adamw":{"lr":0.01}}})");
  auto make = [] { return NamedTensors{{"w", torch::ones({4}, torch::requires_grad())}}; };
  NamedTensors a = make(), b = make();
  std::unique_ptr<Optim> oa = *Optim::Build(spec, a);
  std::unique_ptr<Optim> ob = *Optim::Build(spec, b);
  for (int i = 0; i < 3; ++i) {
    oa->ZeroGrad();
    a[0].second.mutable_grad().fill_(0.5 * (i + 1));
    oa->Step();
  }
  TensorMap state = oa->CaptureState();
  EXPECT_EQ(state.at("w.step").item<int64_t>(), 3);
  ASSERT_TRUE(ob->RestoreState(state).ok());
  {
    torch::NoGradGuard g;
    b[0].second.copy_(a[0].second);
  }
  oa->ZeroGrad();
  ob->ZeroGrad();
  a[0].second.mutable_grad().fill_(1.0);
  b[0].second.mutable_grad().fill_(1.0);
  oa->Step();
  ob->Step();
  EXPECT_TRUE(a[0].second.equal(b[0].second));
}

// K micro-steps of a replica with multiplier 1/N equal one step over the whole window with
// a token-mean loss, on the real model code: the accumulation identity (docs/numerics.md, rule 1).
TEST(ReplicaTest, AccumulatedMicroStepsEqualTheFullWindow) {
  const v1::JobSpec spec = Spec(R"({"seed":5,"model":{"tiny_gpt":{"n_layer":1,"n_head":2,
      "d_model":16,"seq_len":16}},"data":{"text":{"paths":["/dev/null"],"seq_len":16}},
      "optimizer":{"sgd":{"lr":0.1}}})");
  std::vector<data::Sample> samples;
  for (int i = 0; i < 6; ++i) {
    std::vector<int32_t> ids;
    for (int t = 0; t < 3 + 2 * i; ++t) ids.push_back((i * 7 + t * 3) % 256);
    samples.push_back(Tokens(ids));
  }
  data::Dataset d = data::Dataset::FromSamples(samples);
  std::unique_ptr<Replica> micro = *Replica::Create(spec, at::kCPU);
  std::unique_ptr<Replica> full = *Replica::Create(spec, at::kCPU);
  const int64_t n = data::ValidTokens(d, {0, 1, 2, 3, 4, 5});
  for (std::vector<int64_t> mb : {std::vector<int64_t>{0, 1}, {2, 3}, {4, 5}}) {
    ASSERT_TRUE(micro->MicroStep(data::Collate(d, mb), 1.0 / n).ok());
  }
  ASSERT_TRUE(full->MicroStep(data::Collate(d, {0, 1, 2, 3, 4, 5}), 1.0 / n).ok());
  std::vector<at::Tensor> gm = micro->Gradients(), gf = full->Gradients();
  ASSERT_EQ(gm.size(), gf.size());
  for (size_t i = 0; i < gm.size(); ++i) {
    EXPECT_TRUE(at::allclose(gm[i], gf[i], 1e-4, 1e-6)) << i;
  }
  const UnscaleResult um = micro->UnscaleAndNorm(1.0);
  const UnscaleResult uf = full->UnscaleAndNorm(1.0);
  EXPECT_NEAR(um.grad_norm, uf.grad_norm, 1e-5 * uf.grad_norm);
}

// The seeds' probe on the worked example (one parameter, K = 3, S = 8: accumulated .grad
// 16, unscaled 2): the scaled norm is taken before unscaling, the pre-clip norm after, and
// their ratio is S. Without a loss scaler there is no probe.
// Catches: either norm taken on the wrong side of the unscale (ratio 1), the probe reading
// gradients already unscaled by a queued kernel, a probe reported without a scaler.
TEST(ReplicaTest, ScaledNormProbeIsTakenBeforeUnscale) {
  const v1::JobSpec fp32 = Spec(
      R"({"model":{"mlp":{}},"data":{"synthetic_regression":{}},"loss_scaler":{"enabled":true}})");
  std::unique_ptr<Replica> r = *Replica::Create(fp32, at::kCPU);
  std::vector<at::Tensor> grads = r->Gradients();
  for (at::Tensor& g : grads) g.zero_();
  grads.front().view({-1})[0].fill_(8.0 * (1.0 + 2.0 + 3.0) / 3.0);  // S·Σg_k/K = 16
  const UnscaleResult u = r->UnscaleAndNorm(8.0);
  ASSERT_TRUE(u.grad_norm_scaled.has_value());
  EXPECT_DOUBLE_EQ(*u.grad_norm_scaled, 16.0);
  EXPECT_DOUBLE_EQ(u.grad_norm, 2.0);
  EXPECT_DOUBLE_EQ(*u.grad_norm_scaled / u.grad_norm, 8.0);

  const v1::JobSpec plain = Spec(R"({"model":{"mlp":{}},"data":{"synthetic_regression":{}}})");
  EXPECT_FALSE((*Replica::Create(plain, at::kCPU))->UnscaleAndNorm(1.0).grad_norm_scaled);
}

// Catches: a skipped or aborted window leaving gradients (or an injected inf) behind.
TEST(ReplicaTest, ZeroGradLeavesNoResidue) {
  const v1::JobSpec spec = Spec(R"({"model":{"mlp":{}},"data":{"synthetic_regression":{}}})");
  std::unique_ptr<Replica> r = *Replica::Create(spec, at::kCPU);
  r->Gradients().front().view({-1})[0].fill_(std::numeric_limits<float>::infinity());
  EXPECT_TRUE(r->UnscaleAndNorm(1.0).found_inf);
  r->ZeroGrad();
  const UnscaleResult after = r->UnscaleAndNorm(1.0);
  EXPECT_FALSE(after.found_inf);
  EXPECT_EQ(after.grad_norm, 0.0);
}

// spec.validate's comparison of two runs of a window. Catches: a checksum that differs for
// the same micro-steps on the same weights (every healthy rank would be blamed for a fault),
// or that does not see a one-element change (a flipped gradient would pass as reproduced).
TEST(ReplicaTest, GradientChecksumIsReproducibleAndSeesOneElement) {
  const v1::JobSpec spec =
      Spec(R"({"seed":2,"model":{"mlp":{"hidden":16}},"data":{"synthetic_regression":{}}})");
  data::Dataset d = data::Dataset::Load(spec).value();
  std::unique_ptr<Replica> r = *Replica::Create(spec, at::kCPU);
  const auto run = [&] {
    r->ZeroGrad();
    for (std::vector<int64_t> mb : {std::vector<int64_t>{0, 1}, {2, 3}}) {
      EXPECT_TRUE(r->MicroStep(data::Collate(d, mb), 0.25).ok());
    }
    return r->GradientChecksum();
  };
  const uint64_t first = run();
  EXPECT_EQ(run(), first);
  r->Gradients().front().view({-1})[0].add_(1e-6);  // one element
  EXPECT_NE(r->GradientChecksum(), first);
  r->ZeroGrad();
  EXPECT_NE(r->GradientChecksum(), first);
}

// The NCCL path: skipped without a CUDA device (Debian's LibTorch is CPU-only).
TEST(CudaTest, SkipsWithoutDevice) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device / CPU-only LibTorch";
  EXPECT_TRUE(CheckPrecision(v1::JobSpec::fp16, at::Device(at::kCUDA, 0)).ok());
}

}  // namespace
}  // namespace trainstep
