#include "worker/train/amp.h"

#include <ATen/autocast_mode.h>
#include <torch/version.h>

#include <cmath>

namespace trainstep {
namespace {

// The only calls into LibTorch's autocast switches. 2.4 replaced the per-device functions
// (set_enabled / set_cpu_enabled, set_autocast_gpu_dtype / _cpu_dtype) by ones taking the
// device type; the old names are deprecated there.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
void SetAutocast(at::DeviceType type, bool on, at::ScalarType dtype) {
  if (on) at::autocast::set_autocast_dtype(type, dtype);
  at::autocast::set_autocast_enabled(type, on);
}
bool AutocastEnabled(at::DeviceType type) { return at::autocast::is_autocast_enabled(type); }
at::ScalarType AutocastDtype(at::DeviceType type) { return at::autocast::get_autocast_dtype(type); }
#else
void SetAutocast(at::DeviceType type, bool on, at::ScalarType dtype) {
  if (type == at::kCUDA) {
    if (on) at::autocast::set_autocast_gpu_dtype(dtype);
    at::autocast::set_enabled(on);
  } else {
    if (on) at::autocast::set_autocast_cpu_dtype(dtype);
    at::autocast::set_cpu_enabled(on);
  }
}
bool AutocastEnabled(at::DeviceType type) {
  return type == at::kCUDA ? at::autocast::is_enabled() : at::autocast::is_cpu_enabled();
}
at::ScalarType AutocastDtype(at::DeviceType type) {
  return type == at::kCUDA ? at::autocast::get_autocast_gpu_dtype()
                           : at::autocast::get_autocast_cpu_dtype();
}
#endif

}  // namespace

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
  type_ = device.is_cuda() ? at::kCUDA : at::kCPU;
  SetAutocast(type_, true, dtype);
  active_ = true;
  at::autocast::increment_nesting();
}

AutocastScope::~AutocastScope() {
  if (!active_) return;
  // Leaving the outermost scope frees the casted-weight cache, as torch.autocast does.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  SetAutocast(type_, false, at::kFloat);
}

AutocastState CurrentAutocast() {
  AutocastState s;
  s.cpu = AutocastEnabled(at::kCPU);
  s.cuda = AutocastEnabled(at::kCUDA);
  s.cpu_dtype = AutocastDtype(at::kCPU);
  s.cuda_dtype = AutocastDtype(at::kCUDA);
  return s;
}

AutocastReplay::AutocastReplay(const AutocastState& state) : previous_(CurrentAutocast()) {
  Apply(state);
}

AutocastReplay::~AutocastReplay() { Apply(previous_); }

void AutocastReplay::Apply(const AutocastState& state) {
  // On with its dtype, then off where it was off: the dtype comes back either way.
  SetAutocast(at::kCPU, true, state.cpu_dtype);
  SetAutocast(at::kCPU, state.cpu, state.cpu_dtype);
  SetAutocast(at::kCUDA, true, state.cuda_dtype);
  SetAutocast(at::kCUDA, state.cuda, state.cuda_dtype);
}

bool UnscaleAndCheck(std::vector<at::Tensor>& tensors, double inv_scale) {
  if (tensors.empty()) return false;
  return tensors[0].is_cuda() ? internal::UnscaleAndCheckAten(tensors, inv_scale)
                              : internal::UnscaleAndCheckOwn(tensors, inv_scale);
}

namespace internal {

bool UnscaleAndCheckAten(std::vector<at::Tensor>& tensors, double inv_scale) {
  if (tensors.empty()) return false;
  at::Tensor found_inf = at::zeros({1}, tensors[0].options().dtype(at::kFloat));
  at::Tensor inv = at::full({1}, inv_scale, tensors[0].options().dtype(at::kFloat));
  at::_amp_foreach_non_finite_check_and_unscale_(tensors, found_inf, inv);
  return found_inf.item<float>() != 0.0f;  // the window's one device-to-host sync
}

bool UnscaleAndCheckOwn(std::vector<at::Tensor>& tensors, double inv_scale) {
  bool found_inf = false;
  for (at::Tensor& t : tensors) {
    if (inv_scale != 1.0) t.mul_(inv_scale);
    if (!found_inf && !at::isfinite(t).all().item<bool>()) found_inf = true;
  }
  return found_inf;
}

}  // namespace internal

at::Tensor GlobalNormTensor(const std::vector<at::Tensor>& tensors) {
  if (tensors.empty()) return at::zeros({}, at::kDouble);
  // Per-tensor norms stay on the device; one transfer brings the total back.
  std::vector<at::Tensor> norms;
  norms.reserve(tensors.size());
  for (const at::Tensor& t : tensors) norms.push_back(t.to(at::kFloat).norm(2).to(at::kDouble));
  return at::stack(norms).square().sum().sqrt();
}

double GlobalNorm(const std::vector<at::Tensor>& tensors) {
  return GlobalNormTensor(tensors).item<double>();
}

}  // namespace trainstep
