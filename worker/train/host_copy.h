// Named tensors copied to host memory without stalling the device. On CUDA the copies go to
// pinned buffers on a side stream that first waits for the work already queued on the current
// stream, so they see the values of that moment while the current stream runs on; on CPU the
// copy is a plain clone. Used for checkpoints: the file is written from the host copy.
#ifndef TRAINSTEP_WORKER_TRAIN_HOST_COPY_H_
#define TRAINSTEP_WORKER_TRAIN_HOST_COPY_H_

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <string>

namespace trainstep {

// Not thread-safe, except that OrderBeforeChanges and Wait may run on two threads at once.
class HostCopy {
 public:
  using Tensors = std::map<std::string, at::Tensor>;

  // Starts copying `tensors` (all on one device) to host memory and returns at once.
  static std::unique_ptr<HostCopy> Start(const Tensors& tensors);
  ~HostCopy();  // waits for copies still running: they write into this object's buffers
  HostCopy(const HostCopy&) = delete;
  HostCopy& operator=(const HostCopy&) = delete;

  // Makes the calling thread's current stream wait, on the device (the host does not block),
  // until the copies have read their sources. Call it before the sources change (the next
  // optimizer step); a no-op on CPU.
  void OrderBeforeChanges();
  // Blocks until the copies are complete; then returns them (same names, on the CPU).
  const Tensors& Wait();

  bool pinned() const { return cuda_ != nullptr; }

 private:
  HostCopy() = default;
  struct Cuda;  // the side stream's completion event; null for a CPU copy

  Tensors host_;
  std::unique_ptr<Cuda> cuda_;
};

}  // namespace trainstep

#endif  // TRAINSTEP_WORKER_TRAIN_HOST_COPY_H_
