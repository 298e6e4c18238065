// Device choice (worker/train/device.h): --device and LOCAL_RANK, as torchrun and Kubernetes set
// them, against what CUDA makes visible. The rules are checked with a described environment
// on any machine; the last test takes the real one and runs only where a GPU is visible.
#include "worker/train/device.h"

#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

namespace trainstep {
namespace {

DeviceEnv Env(bool built, int count, std::optional<std::string> local_rank = std::nullopt,
              std::optional<std::string> visible = std::nullopt) {
  DeviceEnv e;
  e.cuda_built = built;
  e.cuda_device_count = count;
  e.local_rank = std::move(local_rank);
  e.cuda_visible_devices = std::move(visible);
  return e;
}

std::string Str(const absl::StatusOr<c10::Device>& d) {
  return d.ok() ? d->str() : std::string(d.status().ToString());
}

// Catches: a CPU-only worker (or one on a machine without GPUs) failing to start by default,
// or auto ignoring LOCAL_RANK so that every process of a node lands on GPU 0.
TEST(DeviceTest, AutoFollowsLocalRankWhenCudaIsThereElseCpu) {
  EXPECT_EQ(Str(ChooseDevice("auto", Env(false, 0))), "cpu");
  EXPECT_EQ(Str(ChooseDevice("", Env(false, 0, "3"))), "cpu");
  EXPECT_EQ(Str(ChooseDevice("auto", Env(true, 0, "1"))), "cpu");  // CUDA build, no GPU
  EXPECT_EQ(Str(ChooseDevice("auto", Env(true, 4))), "cuda:0");
  EXPECT_EQ(Str(ChooseDevice("auto", Env(true, 4, "2"))), "cuda:2");
  EXPECT_EQ(Str(ChooseDevice("", Env(true, 4, "3"))), "cuda:3");
}

// Catches: explicit choices overridden by the environment, or cuda:N parsed loosely.
TEST(DeviceTest, ExplicitChoices) {
  EXPECT_EQ(Str(ChooseDevice("cpu", Env(true, 4, "2"))), "cpu");
  EXPECT_EQ(Str(ChooseDevice("cuda", Env(true, 4))), "cuda:0");
  EXPECT_EQ(Str(ChooseDevice("cuda", Env(true, 4, "1"))), "cuda:1");
  EXPECT_EQ(Str(ChooseDevice("cuda:3", Env(true, 4, "1"))), "cuda:3");  // the flag wins
  for (const char* bad : {"gpu", "cuda:", "cuda:-1", "cuda:x", "CPU", "cuda0"}) {
    absl::StatusOr<c10::Device> d = ChooseDevice(bad, Env(true, 4));
    EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(d.status().message().find("--device must be"), std::string::npos) << bad;
  }
}

// Catches: physical GPU ids used as indices (with CUDA_VISIBLE_DEVICES=2,3 the worker must
// use cuda:0 and cuda:1), and a silent fallback to another GPU or the CPU when the one asked
// for does not exist.
TEST(DeviceTest, IndicesCountVisibleDevicesAndMissingOnesAreErrors) {
  absl::StatusOr<c10::Device> d = ChooseDevice("auto", Env(true, 2, "2", "2,3"));
  EXPECT_EQ(d.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(d.status().message().find("LOCAL_RANK=2"), std::string::npos) << d.status();
  EXPECT_NE(d.status().message().find("2 CUDA device(s) visible (CUDA_VISIBLE_DEVICES=\"2,3\")"),
            std::string::npos)
      << d.status();
  EXPECT_EQ(Str(ChooseDevice("auto", Env(true, 2, "1", "2,3"))), "cuda:1");
  d = ChooseDevice("cuda:1", Env(true, 1, std::nullopt, "5"));
  EXPECT_EQ(d.status().code(), absl::StatusCode::kFailedPrecondition);
  d = ChooseDevice("cuda", Env(true, 0));
  EXPECT_EQ(d.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(d.status().message().find("CUDA_VISIBLE_DEVICES=unset"), std::string::npos);
}

// Catches: --device cuda accepted by a worker built without CUDA (it would die later, deep
// inside LibTorch), and a malformed LOCAL_RANK read as 0.
TEST(DeviceTest, RefusesCudaWithoutCudaBuildAndBadLocalRank) {
  absl::StatusOr<c10::Device> d = ChooseDevice("cuda", Env(false, 0));
  EXPECT_EQ(d.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(d.status().message().find("built without CUDA"), std::string::npos);
  for (const char* bad : {"x", "-1", "1.5"}) {
    d = ChooseDevice("auto", Env(true, 2, bad));
    EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(d.status().message().find("LOCAL_RANK"), std::string::npos);
  }
  EXPECT_EQ(Str(ChooseDevice("auto", Env(true, 2, ""))), "cuda:0");  // set but empty
}

// On a GPU machine: the process's own environment picks a device that exists, tensors land
// on it, and it becomes the thread's current device (streams and NCCL use that one).
TEST(DeviceTest, CudaRealDeviceFromTheProcessEnvironment) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device visible: nothing to check";
  DeviceEnv env = DeviceEnvFromProcess();
#ifndef TRAINSTEP_WITH_CUDA
  GTEST_SKIP() << "this build has no CUDA path (TRAINSTEP_WITH_CUDA off)";
#endif
  ASSERT_TRUE(env.cuda_built);
  ASSERT_GT(env.cuda_device_count, 0);
  env.local_rank = std::to_string(env.cuda_device_count - 1);
  absl::StatusOr<c10::Device> d = ChooseDevice("auto", env);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->index(), env.cuda_device_count - 1);
  UseDeviceInThisThread(*d);
  at::Tensor t = torch::ones({4}, torch::TensorOptions().device(*d));
  EXPECT_EQ(t.device(), *d);
  EXPECT_EQ(t.sum().item<float>(), 4.0f);
}

}  // namespace
}  // namespace trainstep
