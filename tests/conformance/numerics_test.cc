// The worked numbers of docs/numerics.md as unit tests of the pieces that produce them: the
// worker's backward multiplier, unscale and norm, and the coordinator's clip coefficient,
// held against torch::nn::utils::clip_grad_norm_.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <vector>

#include "coordinator/step_machine.h"
#include "worker/train/amp.h"
#include "worker/train/loss.h"

namespace trainstep {
namespace {

// One parameter, true micro-gradients 1, 2, 3, K = 3, S = 8 (one unit per micro-batch):
// each backward adds S·g_k/K → .grad 16 → unscaled 2.0 → clipped at max_norm 1 to 1.0,
// with the coefficient clip_grad_norm_ computes on the unscaled gradient.
// Catches: a multiplier without 1/N (48 → 6.0, K× too large), unscaling never or twice, a
// wrong global norm, and clipping in scaled space (16 → 1 → 1/8: the update nearly erased).
TEST(ClipAfterUnscaleWorkedNumbers, OneParameterKThreeScaleEight) {
  const double kScale = 8.0;
  const int64_t kSteps = 3;
  at::Tensor p = torch::zeros({1}, torch::requires_grad());
  const double micro_gradients[] = {1.0, 2.0, 3.0};
  for (double g : micro_gradients) {
    const double multiplier = BackwardMultiplier(v1::Loss::tokens, kScale, /*global_units=*/3,
                                                 /*micro_units=*/1, kSteps, /*world_size=*/1);
    EXPECT_DOUBLE_EQ(multiplier, kScale / 3.0);
    (p.sum() * g * multiplier).backward();  // loss_sum_k = g_k · p
  }
  EXPECT_NEAR(p.grad().item<double>(), 16.0, 1e-5) << "accumulated scaled gradient";

  std::vector<at::Tensor> grads = {p.mutable_grad()};
  EXPECT_FALSE(UnscaleAndCheck(grads, 1.0 / kScale));
  EXPECT_NEAR(p.grad().item<double>(), 2.0, 1e-6) << "unscaled once";
  const double norm = GlobalNorm(grads);
  EXPECT_NEAR(norm, 2.0, 1e-6);
  const double coef = ClipCoefficient(/*max_grad_norm=*/1.0, norm);
  const double clipped = p.grad().item<double>() * coef;
  EXPECT_NEAR(clipped, 1.0, 1e-5);

  // The reference: clip_grad_norm_ on the unscaled gradient.
  at::Tensor q = torch::zeros({1}, torch::requires_grad());
  q.mutable_grad() = torch::full({1}, 2.0);
  const double reference_norm = torch::nn::utils::clip_grad_norm_({q}, 1.0);
  EXPECT_NEAR(norm, reference_norm, 1e-6);
  EXPECT_NEAR(clipped, q.grad().item<double>(), 1e-6);
  EXPECT_NEAR(coef, q.grad().item<double>() / 2.0, 1e-6);

  // What the two bugs would give, for the record: clipping in scaled space, and no 1/K.
  const double scaled_space = 16.0 * ClipCoefficient(1.0, 16.0) / kScale;
  EXPECT_NEAR(scaled_space, 1.0 / 8.0, 1e-6);
  EXPECT_GT(clipped / scaled_space, 7.9);
  const double forgot_k = kScale * (1.0 + 2.0 + 3.0) / kScale;
  EXPECT_NEAR(forgot_k / p.grad().item<double>(), 3.0, 1e-6);
}

// Two micro-batches with 100 and 900 valid tokens weigh 10 % and 90 % of the window loss
// under token normalisation; the mean-of-means mode weighs them 50/50.
// Catches: a token path normalised per micro-batch (short micro-batches up-weighted).
TEST(TokenWeightingWorkedNumbers, HundredAndNineHundredTokens) {
  const int64_t n = 1000;
  const double w1 = BackwardMultiplier(v1::Loss::tokens, 1.0, n, 100, 2, 1) * 100;
  const double w2 = BackwardMultiplier(v1::Loss::tokens, 1.0, n, 900, 2, 1) * 900;
  EXPECT_NEAR(w1, 0.1, 1e-12);
  EXPECT_NEAR(w2, 0.9, 1e-12);
  const double m1 = BackwardMultiplier(v1::Loss::microbatch_mean, 1.0, n, 100, 2, 1) * 100;
  const double m2 = BackwardMultiplier(v1::Loss::microbatch_mean, 1.0, n, 900, 2, 1) * 900;
  EXPECT_NEAR(m1, 0.5, 1e-12);
  EXPECT_NEAR(m2, 0.5, 1e-12);
  // With the loss scale S the weights are S times these, for every mode.
  EXPECT_NEAR(BackwardMultiplier(v1::Loss::tokens, 65536.0, n, 100, 2, 1) * 100, 6553.6, 1e-6);
}

}  // namespace
}  // namespace trainstep
