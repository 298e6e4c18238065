// The workers' collective for one generation: c10d ProcessGroupGloo on CPU (NCCL on CUDA
// when built with TRAINSTEP_WITH_CUDA), rendezvoused through the coordinator's store.
// Gradients never pass through the coordinator.
#ifndef TRAINSTEP_WORKER_COLLECTIVE_COLLECTIVE_H_
#define TRAINSTEP_WORKER_COLLECTIVE_COLLECTIVE_H_

#include <ATen/ATen.h>
#include <torch/version.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/worker_client.h"
#include "trainstep/v1/worker_service.pb.h"

// LibTorch 2.x made ProcessGroupGloo / ProcessGroupNCCL c10d::Backends (a ProcessGroup now
// wraps backends); in 1.13 they are ProcessGroups. The worker holds the Gloo or NCCL object
// itself, so its type is the one place the two versions differ (same calls on both).
namespace c10d {
class Store;
#if TORCH_VERSION_MAJOR >= 2
class Backend;
#else
class ProcessGroup;
#endif
}  // namespace c10d

namespace trainstep {

#if TORCH_VERSION_MAJOR >= 2
using C10dGroup = c10d::Backend;
#else
using C10dGroup = c10d::ProcessGroup;
#endif

// DDP's default bucket cap: one all-reduce per ≤ 25 MiB of gradients.
inline constexpr int64_t kDefaultBucketBytes = 25 * 1024 * 1024;

struct CollectiveOptions {
  at::Device device = at::kCPU;
  std::string host = "127.0.0.1";               // the address peers reach this worker at
  absl::Duration timeout = absl::Seconds(120);  // rendezvous and each collective
};

struct AllReduceStats {
  int64_t calls = 0;
  int64_t bytes = 0;
};

class Collective {
 public:
  // Joins the generation's process group (rank, world size and key prefix from `a`).
  static absl::StatusOr<std::unique_ptr<Collective>> Connect(WorkerClient* client,
                                                             const std::string& job_id,
                                                             const v1::Assignment& a,
                                                             const CollectiveOptions& options);
  // The same over any c10d store (tests use an in-process one); `what` names the group in
  // errors. On CUDA the group is NCCL's, on options.device (one device per rank).
  static absl::StatusOr<std::unique_ptr<Collective>> Connect(
      const c10::intrusive_ptr<c10d::Store>& store, int rank, int world_size,
      const std::string& what, const CollectiveOptions& options);
  ~Collective();

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }

  // SUM over ranks, in place, of `tensors` (same shapes and order on every rank), packed
  // into flat buckets of at most `bucket_bytes` (a bigger tensor goes alone): one
  // collective call per bucket. Every rank must call it, trained samples or not.
  absl::StatusOr<AllReduceStats> AllReduceSum(const std::vector<at::Tensor>& tensors,
                                              int64_t bucket_bytes = kDefaultBucketBytes);
  // `bytes` of rank `src` to every rank.
  absl::Status BroadcastBytes(std::string* bytes, int src);

 private:
  Collective() = default;

  int rank_ = 0;
  int world_size_ = 1;
  at::Device device_ = at::kCPU;
  c10::intrusive_ptr<C10dGroup> group_;
};

}  // namespace trainstep

#endif  // TRAINSTEP_WORKER_COLLECTIVE_COLLECTIVE_H_
