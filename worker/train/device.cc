#include "worker/train/device.h"

#include <torch/cuda.h>

#include <cstdlib>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#ifdef TRAINSTEP_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace trainstep {
namespace {

std::optional<std::string> Getenv(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

std::string Visible(const DeviceEnv& env) {
  return absl::StrCat(env.cuda_device_count, " CUDA device(s) visible (CUDA_VISIBLE_DEVICES=",
                      env.cuda_visible_devices ? "\"" + *env.cuda_visible_devices + "\"" : "unset",
                      ")");
}

// $LOCAL_RANK as a device index; nullopt when unset or empty.
absl::StatusOr<std::optional<int>> LocalRank(const DeviceEnv& env) {
  if (!env.local_rank || env.local_rank->empty()) return std::optional<int>();
  int rank = 0;
  if (!absl::SimpleAtoi(*env.local_rank, &rank) || rank < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("LOCAL_RANK must be a non-negative integer, got \"", *env.local_rank, "\""));
  }
  return std::optional<int>(rank);
}

absl::StatusOr<c10::Device> Cuda(int index, const std::string& why, const DeviceEnv& env) {
  if (!env.cuda_built) {
    return absl::FailedPreconditionError(
        absl::StrCat(why,
                     ": this worker was built without CUDA (TRAINSTEP_WITH_CUDA); use "
                     "--device cpu"));
  }
  if (index >= env.cuda_device_count) {
    return absl::FailedPreconditionError(
        absl::StrCat(why, " asks for cuda:", index, " but ", Visible(env),
                     "; indices count the visible devices, from 0"));
  }
  return c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(index));
}

}  // namespace

DeviceEnv DeviceEnvFromProcess() {
  DeviceEnv env;
#ifdef TRAINSTEP_WITH_CUDA
  env.cuda_built = true;
#endif
  // 0 without a driver or device: LibTorch reports it instead of throwing.
  env.cuda_device_count = static_cast<int>(torch::cuda::device_count());
  env.local_rank = Getenv("LOCAL_RANK");
  env.cuda_visible_devices = Getenv("CUDA_VISIBLE_DEVICES");
  return env;
}

absl::StatusOr<c10::Device> ChooseDevice(const std::string& flag, const DeviceEnv& env) {
  absl::StatusOr<std::optional<int>> local_rank = LocalRank(env);
  if (!local_rank.ok()) return local_rank.status();
  const int from_env = local_rank->value_or(0);
  const std::string env_why = local_rank->has_value() ? absl::StrCat("LOCAL_RANK=", **local_rank)
                                                      : std::string("the default device");
  if (flag.empty() || flag == "auto") {
    if (!env.cuda_built || env.cuda_device_count == 0) return c10::Device(c10::kCPU);
    return Cuda(from_env, absl::StrCat("--device auto with ", env_why), env);
  }
  if (flag == "cpu") return c10::Device(c10::kCPU);
  if (flag == "cuda") return Cuda(from_env, absl::StrCat("--device cuda with ", env_why), env);
  int index = 0;
  if (absl::StartsWith(flag, "cuda:") && absl::SimpleAtoi(flag.substr(5), &index) && index >= 0) {
    return Cuda(index, absl::StrCat("--device ", flag), env);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--device must be auto, cpu, cuda or cuda:N, got \"", flag, "\""));
}

void UseDeviceInThisThread(const c10::Device& device) {
#ifdef TRAINSTEP_WITH_CUDA
  if (device.is_cuda()) c10::cuda::set_device(device.index());
#else
  (void)device;
#endif
}

}  // namespace trainstep
