// HostCopy (worker/train/host_copy.h): a checkpoint's copy holds the values of the moment it was
// started, whatever the training does next. On CPU a clone; on CUDA pinned buffers filled on
// a side stream — those tests run where a GPU is visible and skip, saying so, elsewhere.
#include "worker/train/host_copy.h"

#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

namespace trainstep {
namespace {

// Catches: a "copy" that shares storage with the live tensor (the checkpoint would hold the
// weights of a later update, or a mix of two).
TEST(HostCopyTest, CpuCopyKeepsTheValuesOfItsStart) {
  HostCopy::Tensors live = {{"w", torch::arange(6, torch::kFloat).view({2, 3})},
                            {"step", torch::scalar_tensor(7, torch::kLong)}};
  std::unique_ptr<HostCopy> copy = HostCopy::Start(live);
  copy->OrderBeforeChanges();
  live["w"].add_(100);
  live["step"].fill_(8);
  const HostCopy::Tensors& host = copy->Wait();
  EXPECT_TRUE(at::equal(host.at("w"), torch::arange(6, torch::kFloat).view({2, 3})));
  EXPECT_EQ(host.at("step").item<int64_t>(), 7);
  EXPECT_FALSE(copy->pinned());
}

TEST(HostCopyTest, EmptyMapIsFine) {
  std::unique_ptr<HostCopy> copy = HostCopy::Start({});
  EXPECT_TRUE(copy->Wait().empty());
}

#ifdef TRAINSTEP_WITH_CUDA
constexpr bool kCudaBuild = true;
#else
constexpr bool kCudaBuild = false;
#endif

// The CUDA path: pinned host buffers; the side stream waits for what was queued on the
// current stream before Start (the copy sees it) and, after OrderBeforeChanges, the current
// stream's later in-place change waits for the copy (the copy does not see it). The changes
// are large enough that a missing wait would show (the kernels run for milliseconds).
TEST(HostCopyTest, CudaCopySeesQueuedWorkAndNotLaterChanges) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device visible here";
  if (!kCudaBuild) GTEST_SKIP() << "built without the CUDA path (TRAINSTEP_WITH_CUDA)";
  auto o = torch::TensorOptions().device(torch::kCUDA, 0);
  at::Tensor w = torch::zeros({4096, 4096}, o);
  at::Tensor m = torch::randn({4096, 4096}, o);
  // Queued, not finished: w = 1 after a few large matmuls.
  for (int i = 0; i < 8; ++i) m = at::matmul(m, m).clamp_(-1, 1);
  w.fill_(m.abs().amax().clamp(1.0, 1.0));
  std::unique_ptr<HostCopy> copy = HostCopy::Start({{"w", w}, {"m", m}});
  copy->OrderBeforeChanges();
  w.fill_(5);  // the next optimizer step
  const HostCopy::Tensors& host = copy->Wait();
  EXPECT_TRUE(copy->pinned());
  EXPECT_TRUE(host.at("w").is_pinned());
  EXPECT_EQ(host.at("w").device(), at::Device(at::kCPU));
  EXPECT_EQ(host.at("w").min().item<float>(), 1.0f);
  EXPECT_EQ(host.at("w").max().item<float>(), 1.0f);
  EXPECT_TRUE(at::equal(host.at("m"), m.cpu()));
  EXPECT_EQ(w.max().item<float>(), 5.0f);
}

}  // namespace
}  // namespace trainstep
