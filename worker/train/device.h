// Which device a worker trains on, decided once at start-up from --device and the
// environment torchrun and Kubernetes' device plugin set. CUDA indices are CUDA's own: they
// count the devices CUDA_VISIBLE_DEVICES leaves visible, never physical ids.
#ifndef TRAINSTEP_WORKER_TRAIN_DEVICE_H_
#define TRAINSTEP_WORKER_TRAIN_DEVICE_H_

#include <c10/core/Device.h>

#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace trainstep {

// What ChooseDevice reads besides the flag; from the process by DeviceEnvFromProcess().
struct DeviceEnv {
  bool cuda_built = false;                          // TRAINSTEP_WITH_CUDA
  int cuda_device_count = 0;                        // visible devices (0 without a driver)
  std::optional<std::string> local_rank;            // $LOCAL_RANK (torchrun's per-node rank)
  std::optional<std::string> cuda_visible_devices;  // $CUDA_VISIBLE_DEVICES, for messages
};

DeviceEnv DeviceEnvFromProcess();

// `flag` (--device): "auto" (or empty): cuda:$LOCAL_RANK (cuda:0 without it) when the worker
// is built with CUDA and a device is visible, else cpu. "cpu". "cuda": cuda:$LOCAL_RANK or
// cuda:0. "cuda:N". INVALID_ARGUMENT for another value or a bad $LOCAL_RANK;
// FAILED_PRECONDITION (with what is visible) when the CUDA device asked for does not exist.
absl::StatusOr<c10::Device> ChooseDevice(const std::string& flag, const DeviceEnv& env);

// Makes `device` the calling thread's current CUDA device (a no-op for cpu), so that streams,
// NCCL communicators and autocast of this thread use it.
void UseDeviceInThisThread(const c10::Device& device);

}  // namespace trainstep

#endif  // TRAINSTEP_WORKER_TRAIN_DEVICE_H_
