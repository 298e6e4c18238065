#include "worker/amp.h"

#include <ATen/autocast_mode.h>

#include <cmath>

namespace trainstep {

absl::Status CheckPrecision(v1::JobSpec::Precision precision, const at::Device& device) {
  if (precision == v1::JobSpec::fp16 && !device.is_cuda()) {
    return absl::FailedPreconditionError(
        "precision fp16 needs a CUDA device (LibTorch's CPU autocast is bf16 only); use "
        "precision bf16, or precision fp32 with loss_scaler.enabled true to exercise the scaler");
  }
  return absl::OkStatus();
}

AutocastScope::AutocastScope(v1::JobSpec::Precision precision, const at::Device& device) {
  if (precision == v1::JobSpec::fp32) return;
  const at::ScalarType dtype = precision == v1::JobSpec::bf16 ? at::kBFloat16 : at::kHalf;
  if (device.is_cuda()) {
    at::autocast::set_autocast_gpu_dtype(dtype);
    at::autocast::set_enabled(true);
    cuda_ = true;
  } else {
    at::autocast::set_autocast_cpu_dtype(dtype);
    at::autocast::set_cpu_enabled(true);
    cpu_ = true;
  }
  at::autocast::increment_nesting();
}

AutocastScope::~AutocastScope() {
  if (!cpu_ && !cuda_) return;
  // Leaving the outermost scope frees the casted-weight cache, as torch.autocast does.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  if (cpu_) at::autocast::set_cpu_enabled(false);
  if (cuda_) at::autocast::set_enabled(false);
}

bool UnscaleAndCheck(std::vector<at::Tensor>& tensors, double inv_scale) {
  if (tensors.empty()) return false;
  if (tensors[0].is_cuda()) {
    at::Tensor found_inf = at::zeros({1}, tensors[0].options().dtype(at::kFloat));
    at::Tensor inv = at::full({1}, inv_scale, tensors[0].options().dtype(at::kFloat));
    at::_amp_foreach_non_finite_check_and_unscale_(tensors, found_inf, inv);
    return found_inf.item<float>() != 0.0f;
  }
  bool found_inf = false;
  for (at::Tensor& t : tensors) {
    if (inv_scale != 1.0) t.mul_(inv_scale);
    if (!found_inf && !at::isfinite(t).all().item<bool>()) found_inf = true;
  }
  return found_inf;
}

double GlobalNorm(const std::vector<at::Tensor>& tensors) {
  double sum_squares = 0.0;
  for (const at::Tensor& t : tensors) {
    const double n = t.to(at::kFloat).norm(2).item<double>();
    sum_squares += n * n;
  }
  return std::sqrt(sum_squares);
}

}  // namespace trainstep
