#include "worker/train/host_copy.h"

#include <ATen/ATen.h>

#ifdef TRAINSTEP_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace trainstep {

#ifdef TRAINSTEP_WITH_CUDA
struct HostCopy::Cuda {
  c10::DeviceIndex device = 0;
  at::cuda::CUDAEvent copied;
};
#else
struct HostCopy::Cuda {};
#endif

HostCopy::~HostCopy() {
  if (cuda_ != nullptr) Wait();
}

std::unique_ptr<HostCopy> HostCopy::Start(const Tensors& tensors) {
  std::unique_ptr<HostCopy> c(new HostCopy());
  // Small CPU tensors (an optimizer's step counts) may sit beside the CUDA ones.
  const at::Tensor* on_device = nullptr;
  for (const auto& [name, t] : tensors) {
    if (t.is_cuda()) on_device = &t;
  }
#ifdef TRAINSTEP_WITH_CUDA
  if (on_device != nullptr) {
    const c10::cuda::CUDAGuard guard(on_device->device());
    c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream();
    c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool();
    // The side stream starts after everything queued so far: it sees the values of now.
    at::cuda::CUDAEvent queued;
    queued.record(current);
    queued.block(side);
    c->cuda_ = std::make_unique<Cuda>();
    c->cuda_->device = on_device->device().index();
    {
      const c10::cuda::CUDAStreamGuard on_side(side);
      for (const auto& [name, t] : tensors) {
        at::Tensor src = t.detach();
        at::Tensor dst = at::empty(src.sizes(), src.options().device(at::kCPU).pinned_memory(true));
        dst.copy_(src, /*non_blocking=*/true);
        // The caching allocator must not hand `src`'s memory to another stream's work until
        // the side stream has read it.
        if (src.is_cuda()) src.record_stream(side);
        c->host_[name] = dst;
      }
    }
    c->cuda_->copied.record(side);
    return c;
  }
#endif
  (void)on_device;
  for (const auto& [name, t] : tensors) c->host_[name] = t.detach().cpu().clone();
  return c;
}

void HostCopy::OrderBeforeChanges() {
#ifdef TRAINSTEP_WITH_CUDA
  if (cuda_ != nullptr) cuda_->copied.block(c10::cuda::getCurrentCUDAStream(cuda_->device));
#endif
}

const HostCopy::Tensors& HostCopy::Wait() {
#ifdef TRAINSTEP_WITH_CUDA
  if (cuda_ != nullptr) cuda_->copied.synchronize();
#endif
  return host_;
}

}  // namespace trainstep
