// Mixed precision (worker/train/amp.h) on both LibTorch versions and both devices: the autocast
// scope casts exactly inside it (bf16 on CPU and CUDA, fp16 on CUDA), the two unscale +
// non-finite implementations agree, and the CUDA one is the one a CUDA gradient gets. Tests
// named Cuda* run where a GPU is visible and skip, saying so, elsewhere; the CPU-side logic
// of each is checked on every machine.
#include "worker/train/amp.h"

#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <limits>

namespace trainstep {
namespace {

#define SKIP_WITHOUT_CUDA()                                                        \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device visible here"; \
  if (!kCudaBuild) GTEST_SKIP() << "built without the CUDA path (TRAINSTEP_WITH_CUDA)"

#ifdef TRAINSTEP_WITH_CUDA
constexpr bool kCudaBuild = true;
#else
constexpr bool kCudaBuild = false;
#endif

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNan = std::numeric_limits<float>::quiet_NaN();

// A matmul's result dtype inside and after the scope: what autocast decided.
std::pair<at::ScalarType, at::ScalarType> MatmulDtypes(v1::JobSpec::Precision p,
                                                       const at::Device& device) {
  at::Tensor a = torch::randn({8, 8}, torch::TensorOptions().device(device));
  at::ScalarType inside;
  {
    AutocastScope scope(p, device);
    inside = at::matmul(a, a).scalar_type();
  }
  return {inside, at::matmul(a, a).scalar_type()};
}

// Catches: autocast not switched on for CPU bf16 (silently fp32), or left on after the scope
// (the loss and optimizer would run in bf16) — with LibTorch 1.13's and 2.x's switches alike.
TEST(AutocastTest, CpuBf16InsideTheScopeOnly) {
  auto [inside, after] = MatmulDtypes(v1::JobSpec::bf16, at::kCPU);
  EXPECT_EQ(inside, at::kBFloat16);
  EXPECT_EQ(after, at::kFloat);
  auto [fp32_inside, fp32_after] = MatmulDtypes(v1::JobSpec::fp32, at::kCPU);
  EXPECT_EQ(fp32_inside, at::kFloat);
  EXPECT_EQ(fp32_after, at::kFloat);
}

// Catches: an fp16 job started on CPU (CPU autocast has no fp16) instead of refused with what
// to do, and a CUDA fp16 job refused.
TEST(AutocastTest, Fp16NeedsCuda) {
  absl::Status s = CheckPrecision(v1::JobSpec::fp16, at::kCPU);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("CUDA"), std::string::npos);
  EXPECT_TRUE(CheckPrecision(v1::JobSpec::fp16, at::Device(at::kCUDA, 0)).ok());
  EXPECT_TRUE(CheckPrecision(v1::JobSpec::bf16, at::kCPU).ok());
}

std::vector<at::Tensor> Grads(const at::Device& device, float poison) {
  torch::manual_seed(3);
  auto o = torch::TensorOptions().device(device);
  std::vector<at::Tensor> g = {torch::randn({5, 7}, o) * 1024, torch::randn({3}, o) * 1024,
                               torch::randn({2, 2, 2}, o) * 1024};
  if (poison != 0.0f) g[1].view({-1})[2].fill_(poison);
  return g;
}

// Runs `fn` on copies of the same gradients; returns (found_inf, the unscaled tensors).
template <typename Fn>
std::pair<bool, std::vector<at::Tensor>> Run(Fn fn, const at::Device& d, float poison, double inv) {
  std::vector<at::Tensor> g = Grads(d, poison);
  const bool found = fn(g, inv);
  return {found, g};
}

void ExpectSameResults(const at::Device& d) {
  for (float poison : {0.0f, kInf, -kInf, kNan}) {
    for (double inv : {1.0, 1.0 / 65536, 0.125}) {
      auto [own_found, own] = Run(internal::UnscaleAndCheckOwn, d, poison, inv);
      auto [aten_found, aten] = Run(internal::UnscaleAndCheckAten, d, poison, inv);
      EXPECT_EQ(own_found, poison != 0.0f) << "poison " << poison << " inv " << inv;
      EXPECT_EQ(aten_found, own_found) << "poison " << poison << " inv " << inv;
      for (size_t i = 0; i < own.size(); ++i) {
        // Both multiply every value, the non-finite ones too (GradScaler's semantics).
        EXPECT_TRUE(at::allclose(aten[i].cpu(), own[i].cpu(), 1e-6, 0, /*equal_nan=*/true))
            << "tensor " << i << " poison " << poison << " inv " << inv;
      }
    }
  }
}

// Catches: our CPU unscale + check drifting from PyTorch's (a value not multiplied, a NaN or
// -inf not counted, an inf residue hidden by the unscale). LibTorch 1.13 has the ATen op for
// CUDA only; from 2.x on it also runs on CPU and both are held to the same results here.
TEST(UnscaleTest, OwnImplementationMatchesTheAtenOpOnCpu) {
  try {
    std::vector<at::Tensor> probe = Grads(at::kCPU, 0.0f);
    internal::UnscaleAndCheckAten(probe, 0.5);
  } catch (const std::exception&) {
    GTEST_SKIP() << "LibTorch " << TORCH_VERSION
                 << " has _amp_foreach_non_finite_check_and_unscale_ for CUDA only; the CUDA "
                    "test compares them on a GPU";
  }
  ExpectSameResults(at::kCPU);
}

// Catches: the CPU gradients of a CPU worker sent to the CUDA-only op (1.13 throws there).
TEST(UnscaleTest, CpuGradientsTakeTheOwnPath) {
  std::vector<at::Tensor> g = Grads(at::kCPU, kInf);
  EXPECT_TRUE(UnscaleAndCheck(g, 0.5));
  std::vector<at::Tensor> clean = Grads(at::kCPU, 0.0f);
  std::vector<at::Tensor> expected = Grads(at::kCPU, 0.0f);
  EXPECT_FALSE(UnscaleAndCheck(clean, 0.5));
  EXPECT_TRUE(at::allclose(clean[0], expected[0] * 0.5));
}

// Catches: a global norm that is not the L2 norm over all tensors, or one that changes with
// the device it is computed on.
TEST(UnscaleTest, GlobalNormIsTheL2NormOfAll) {
  std::vector<at::Tensor> g = {torch::tensor({3.0f}), torch::tensor({4.0f, 12.0f})};
  EXPECT_NEAR(GlobalNorm(g), 13.0, 1e-6);  // per-tensor norms are fp32
  EXPECT_DOUBLE_EQ(GlobalNorm({}), 0.0);
}

TEST(CudaAmpTest, CudaBf16AndFp16AutocastInsideTheScopeOnly) {
  SKIP_WITHOUT_CUDA();
  const at::Device cuda(at::kCUDA, 0);
  auto [bf16_inside, bf16_after] = MatmulDtypes(v1::JobSpec::bf16, cuda);
  EXPECT_EQ(bf16_inside, at::kBFloat16);
  EXPECT_EQ(bf16_after, at::kFloat);
  auto [fp16_inside, fp16_after] = MatmulDtypes(v1::JobSpec::fp16, cuda);
  EXPECT_EQ(fp16_inside, at::kHalf);
  EXPECT_EQ(fp16_after, at::kFloat);
  // CPU autocast stays off while CUDA's is on (one device's scope never leaks into the other).
  at::Tensor c = torch::randn({4, 4});
  AutocastScope scope(v1::JobSpec::fp16, cuda);
  EXPECT_EQ(at::matmul(c, c).scalar_type(), at::kFloat);
}

// The CUDA path: _amp_foreach_non_finite_check_and_unscale_ gives our CPU implementation's
// results, and UnscaleAndCheck sends CUDA gradients to it.
TEST(CudaAmpTest, CudaUnscaleMatchesTheCpuImplementation) {
  SKIP_WITHOUT_CUDA();
  ExpectSameResults(at::Device(at::kCUDA, 0));
  std::vector<at::Tensor> g = Grads(at::Device(at::kCUDA, 0), kNan);
  EXPECT_TRUE(UnscaleAndCheck(g, 0.25));
  EXPECT_NEAR(GlobalNorm({torch::tensor({3.0f, 4.0f}).cuda()}), 5.0, 1e-6);
}

}  // namespace
}  // namespace trainstep
