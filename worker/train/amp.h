// Mixed precision in one place: the autocast scope (the only code that touches LibTorch's
// autocast API, whose names changed in 2.x) and the unscale + non-finite check that runs
// once per window, after the all-reduce and before any norm or clip (docs/numerics.md,
// rules 7 and 8).
#ifndef TRAINSTEP_WORKER_TRAIN_AMP_H_
#define TRAINSTEP_WORKER_TRAIN_AMP_H_

#include <ATen/ATen.h>

#include <vector>

#include "absl/status/status.h"
#include "trainstep/v1/spec.pb.h"

namespace trainstep {

// fp16 needs CUDA autocast; refuse it on CPU with what to do instead.
absl::Status CheckPrecision(v1::JobSpec::Precision precision, const at::Device& device);

// Enables autocast for the scope's lifetime: bf16 on CPU or CUDA, fp16 on CUDA; fp32 does
// nothing. Scopes nest (LibTorch counts them): leaving the outermost one frees the
// casted-weight cache.
class AutocastScope {
 public:
  AutocastScope(v1::JobSpec::Precision precision, const at::Device& device);
  ~AutocastScope();
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  bool active_ = false;
  at::DeviceType type_ = at::kCPU;
};

// Which autocast is on, per device type, and in which dtype: what a recomputation in backward
// (activation checkpointing) must see to compute what the forward computed.
struct AutocastState {
  bool cpu = false;
  bool cuda = false;
  at::ScalarType cpu_dtype = at::kBFloat16;
  at::ScalarType cuda_dtype = at::kHalf;
};
AutocastState CurrentAutocast();

// Puts `state` in force for its lifetime (in this thread) and the previous one back after.
class AutocastReplay {
 public:
  explicit AutocastReplay(const AutocastState& state);
  ~AutocastReplay();
  AutocastReplay(const AutocastReplay&) = delete;
  AutocastReplay& operator=(const AutocastReplay&) = delete;

 private:
  void Apply(const AutocastState& state);
  AutocastState previous_;
};

// tensors ×= inv_scale in place; returns true if any value is not finite. The CPU path is
// our own (Debian's LibTorch 1.13 has the ATen op for CUDA only); CUDA uses
// _amp_foreach_non_finite_check_and_unscale_.
bool UnscaleAndCheck(std::vector<at::Tensor>& tensors, double inv_scale);

namespace internal {
// The two implementations UnscaleAndCheck chooses between, exposed so tests can hold them
// to the same results. The ATen op needs all tensors on one device, float types.
bool UnscaleAndCheckAten(std::vector<at::Tensor>& tensors, double inv_scale);
bool UnscaleAndCheckOwn(std::vector<at::Tensor>& tensors, double inv_scale);
}  // namespace internal

// Global L2 norm: each tensor's norm in fp32 (as clip_grad_norm_), combined in double.
double GlobalNorm(const std::vector<at::Tensor>& tensors);
// The same as a 0-dim double tensor on the tensors' device, not yet read (no host sync).
at::Tensor GlobalNormTensor(const std::vector<at::Tensor>& tensors);

}  // namespace trainstep

#endif  // TRAINSTEP_WORKER_TRAIN_AMP_H_
