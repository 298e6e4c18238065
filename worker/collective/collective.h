// The workers' collective for one generation: c10d ProcessGroupGloo on CPU (NCCL on CUDA
// when built with TRAINSTEP_WITH_CUDA), rendezvoused through the coordinator's store.
// Gradients never pass through the coordinator.
#ifndef TRAINSTEP_WORKER_COLLECTIVE_COLLECTIVE_H_
#define TRAINSTEP_WORKER_COLLECTIVE_COLLECTIVE_H_

#include <ATen/ATen.h>
#include <torch/version.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "trainstep/v1/worker_service.pb.h"
#include "worker/link/worker_client.h"

// LibTorch 2.x made ProcessGroupGloo / ProcessGroupNCCL c10d::Backends (a ProcessGroup now
// wraps backends); in 1.13 they are ProcessGroups. The worker holds the Gloo or NCCL object
// itself, so its type is the one place the two versions differ (same calls on both).
namespace c10d {
class Store;
class Work;
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
// DDP's cap on the first bucket (the last layers' gradients, final first in backward): small,
// so that an all-reduce starts early in backward even for a model under 25 MiB.
inline constexpr int64_t kDefaultFirstBucketBytes = 1024 * 1024;

struct CollectiveOptions {
  at::Device device = at::kCPU;
  std::string host = "127.0.0.1";               // the address peers reach this worker at
  absl::Duration timeout = absl::Seconds(120);  // rendezvous and each collective
  // Asked every `poll` while a Gloo collective waits for the other ranks; false (the
  // generation is over: a peer died or stopped) ends the wait at once with UNAVAILABLE instead
  // of at `timeout`. Empty: wait for the collective itself. NCCL waits are not polled.
  std::function<bool()> keep_waiting;
  absl::Duration poll = absl::Milliseconds(50);
};

struct AllReduceStats {
  int64_t calls = 0;
  int64_t bytes = 0;
  // Of `calls`, the buckets launched before PendingAllReduce::Finish (while backward ran).
  int64_t overlapped_calls = 0;
};

// One bucket of a gradient all-reduce: tensors [begin, end) of the list, all of one dtype.
struct BucketRange {
  size_t begin = 0;
  size_t end = 0;
  int64_t bytes = 0;
};

// DDP's rule over `tensors` in their order: consecutive tensors of one dtype while they fit
// in `bucket_bytes`, the first bucket in min(`first_bucket_bytes`, `bucket_bytes`) (a bigger
// tensor goes alone). Shapes and dtypes alone decide it, so every rank, and both ways of
// running the all-reduce, get the same buckets.
std::vector<BucketRange> PlanBuckets(const std::vector<at::Tensor>& tensors, int64_t bucket_bytes,
                                     int64_t first_bucket_bytes = kDefaultFirstBucketBytes);

class PendingAllReduce;

class Collective {
 public:
  // Joins the generation's process group (rank, world size and key prefix from `a`).
  static absl::StatusOr<std::unique_ptr<Collective>> Connect(std::shared_ptr<WorkerRpc> client,
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
  // into flat buckets of at most `bucket_bytes`, the first of at most 1 MiB (PlanBuckets; a
  // bigger tensor goes alone): one collective call per bucket. Every rank must call it, trained
  // samples or not.
  absl::StatusOr<AllReduceStats> AllReduceSum(const std::vector<at::Tensor>& tensors,
                                              int64_t bucket_bytes = kDefaultBucketBytes);
  // The same SUM — the same buckets (PlanBuckets of `tensors`' shapes), each packed, summed
  // and copied back as AllReduceSum does, so bitwise the same results — but each bucket is
  // launched as soon as its tensors are final (PendingAllReduce::MarkReady, from autograd
  // hooks while backward still runs), and PendingAllReduce::Finish waits. A rank may mix the
  // two: the collectives are the same, in the same order. The result must not outlive this
  // Collective. CPU (Gloo) only: MarkReady packs on the calling thread's current stream.
  std::unique_ptr<PendingAllReduce> StartAllReduceSum(const std::vector<at::Tensor>& tensors,
                                                      int64_t bucket_bytes = kDefaultBucketBytes);
  // `bytes` of rank `src` to every rank.
  absl::Status BroadcastBytes(std::string* bytes, int src);

 private:
  friend class PendingAllReduce;
  Collective() = default;
  // A Gloo group of the generation; with options.keep_waiting, given up (an exception) once
  // the generation is over while the connect still waits for a peer.
  static c10::intrusive_ptr<C10dGroup> JoinGloo(const c10::intrusive_ptr<c10d::Store>& store,
                                                int rank, int world_size,
                                                const CollectiveOptions& options);
  // Runs `start` (which returns the collective's work) and waits for it as
  // options.keep_waiting allows; a failure of the collective is UNAVAILABLE naming `what`.
  template <typename Start>
  absl::Status Await(const std::string& what, Start&& start);
  // Await's wait for a launched collective; throws its error, or once the generation is over
  // (then abandoned_ is set).
  void WaitOrThrow(const c10::intrusive_ptr<c10d::Work>& work);

  int rank_ = 0;
  int world_size_ = 1;
  at::Device device_ = at::kCPU;
  CollectiveOptions options_;
  // Set when a wait was given up while the collective still ran: its threads are blocked on
  // peers that are gone, so the group is left to end at its own timeout, not destroyed.
  bool abandoned_ = false;
  c10::intrusive_ptr<C10dGroup> group_;
};

// A gradient all-reduce in flight (Collective::StartAllReduceSum). Every rank must launch the
// same collectives in the same order (Gloo pairs them by order), so bucket k is launched only
// once its tensors are final AND buckets 0..k-1 were launched, whatever order the tensors
// become final in (as DDP's reducer does). Thread-safe.
class PendingAllReduce {
 public:
  // One not finished (a failed backward) leaves its collectives to end on their own: if any
  // still runs, the Collective is abandoned (not destroyed at its end).
  ~PendingAllReduce();
  PendingAllReduce(const PendingAllReduce&) = delete;
  PendingAllReduce& operator=(const PendingAllReduce&) = delete;

  // Tensor `index` (of the list given to StartAllReduceSum) holds its final value `value`:
  // launches every bucket now ready whose predecessors were launched. Never throws; an error
  // (a tensor made final twice, a shape that changed, a failed launch) stops launching and is
  // Finish's result. Ignored once Finish began.
  void MarkReady(size_t index, const at::Tensor& value);
  // Launches the buckets not launched yet, in order, packed from `tensors` (tensors never
  // made final by MarkReady — a parameter without a gradient in this backward — and those
  // behind them), waits for every bucket as AllReduceSum does (keep_waiting included), and
  // copies the sums into `tensors`: the same list (order, shapes) as at the start.
  absl::StatusOr<AllReduceStats> Finish(const std::vector<at::Tensor>& tensors);

  // Buckets launched so far (in order: 0..launched()-1).
  int launched() const;
  // When the first bucket was launched; none before any was.
  std::optional<absl::Time> first_launch() const;

 private:
  friend class Collective;
  struct State;
  PendingAllReduce(Collective* collective, std::unique_ptr<State> state);
  // Launches, in order, the buckets whose tensors are all final.
  void LaunchReadyLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Packs bucket `b` (from `tensors`, or the values MarkReady was given) and launches it.
  void LaunchLocked(size_t b, const std::vector<at::Tensor>* tensors)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Abandons the collective if a launched bucket still runs.
  void AbandonIfRunning() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Collective* const collective_;
  mutable absl::Mutex mu_;
  std::unique_ptr<State> state_ ABSL_GUARDED_BY(mu_);
};

}  // namespace trainstep

#endif  // TRAINSTEP_WORKER_COLLECTIVE_COLLECTIVE_H_
