// Which samples each accumulation window trains, and which of them each rank computes.
// A pure function of (resolved spec, dataset size, window id, rank, world size): every
// worker, and a retried window after a membership change, computes the same plan.
#ifndef TRAINSTEP_CORE_WINDOW_PLAN_H_
#define TRAINSTEP_CORE_WINDOW_PLAN_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "trainstep/v1/spec.pb.h"
#include "trainstep/v1/types.pb.h"

namespace trainstep {

// Plans windows over a dataset of `dataset_size` samples. Thread-safe (the shuffled order of
// the latest epoch is cached under a mutex). Not copyable or movable; hold it by pointer or in
// a std::optional when it must be created late.
class WindowPlanner {
 public:
  WindowPlanner(const v1::JobSpec& resolved, int64_t dataset_size);
  WindowPlanner(const WindowPlanner&) = delete;
  WindowPlanner& operator=(const WindowPlanner&) = delete;

  // B = GlobalBatchSamples(spec) = micro_batch_size × accumulation_steps × workers.count:
  // a window's samples are fixed by the spec, never by how many workers are alive.
  int64_t global_batch() const { return global_batch_; }
  int64_t dataset_size() const { return dataset_size_; }
  // batch.tail dynamic: ceil(S / B), the last window of an epoch may be short;
  // drop: floor(S / B), the short last window is not trained (0 when S < B).
  // The coordinator asks this planner too (StepMachine): one rule for both.
  int64_t windows_per_epoch() const { return windows_per_epoch_; }

  // Window ids are 1-based and count on across epochs: window w belongs to epoch
  // (w - 1) / windows_per_epoch(), 0-based. 0 for w < 1 or when no window trains.
  int64_t EpochOf(int64_t window_id) const;

  // How many samples window `window_id` trains: B, except the last window of an epoch under
  // batch.tail dynamic, which holds what is left (S mod B when S is not a multiple of B).
  // 0 for window_id < 1 or when no window trains.
  int64_t WindowSize(int64_t window_id) const;
  // The short last window of an epoch: fewer than B samples (only under batch.tail dynamic).
  bool IsTailWindow(int64_t window_id) const;
  // Whether `window_id` is the last window of its epoch.
  bool EndsEpoch(int64_t window_id) const;
  // What every epoch leaves out: S − windows_per_epoch·B under batch.tail drop, else 0.
  int64_t dropped_per_epoch() const { return dropped_per_epoch_; }
  // What `epoch` leaves out (samples 0 when nothing): positions [windows_per_epoch·B, S) of its
  // order and, when at most kMaxListedDroppedSamples, their dataset indices. O(dropped)
  // even when shuffled: the whole order is never built.
  v1::DroppedTail DroppedTail(int64_t epoch) const;
  static constexpr int64_t kMaxListedDroppedSamples = 4096;

  // The order the samples of `epoch` are visited in: 0..S-1 without shuffle, otherwise a
  // Fisher–Yates permutation seeded by (seed, epoch). Empty for epoch < 0.
  std::vector<int64_t> EpochOrder(int64_t epoch) const;

  // The dataset indices of window `window_id`, in window order: positions
  // [i·B, min((i+1)·B, S)) of its epoch's order, i = the window's index in the epoch.
  // Empty for window_id < 1 or when no window trains.
  std::vector<int64_t> WindowSamples(int64_t window_id) const;

  // This rank's share of the window: window position j goes to rank j % world_size, then
  // the share is cut, in order, into micro-batches of ≤ micro_batch_size samples. A rank may
  // get none (a short tail window). Requires 0 ≤ rank < world_size; otherwise empty.
  std::vector<std::vector<int64_t>> RankMicroBatches(int64_t window_id, int rank,
                                                     int world_size) const;

 private:
  // The epoch order, shared with the cache.
  std::shared_ptr<const std::vector<int64_t>> Order(int64_t epoch) const;
  uint64_t ShuffleSeed(int64_t epoch) const;

  const bool shuffle_;
  const uint64_t seed_;
  const int64_t micro_batch_size_;
  const int64_t global_batch_;
  const int64_t dataset_size_;
  const int64_t windows_per_epoch_;
  const int64_t dropped_per_epoch_;

  mutable absl::Mutex mu_;
  // The order of epoch cached_epoch_ (-1: none yet). Shuffled orders only.
  mutable int64_t cached_epoch_ ABSL_GUARDED_BY(mu_) = -1;
  mutable std::shared_ptr<const std::vector<int64_t>> cached_order_ ABSL_GUARDED_BY(mu_);
};

// Windows per epoch for S samples, global batch B and the tail policy: ceil(S/B) when
// `drop_tail` is false, floor(S/B) when true. 0 when S ≤ 0 or B ≤ 0.
int64_t WindowsPerEpoch(int64_t dataset_size, int64_t global_batch, bool drop_tail);

// Rank `rank`'s share of a held-out evaluation (spec.eval): the first
// min(eval_samples, max_batches × micro_batch_size) samples (all of them when max_batches is 0),
// cut in file order into micro-batches of micro_batch_size (the last may be short), micro-batch
// m going to rank m mod world_size. The set is the same for every world size, so the loss over
// it (Σ over ranks ÷ Σ units) does not depend on how many workers there are.
std::vector<std::vector<int64_t>> EvalMicroBatches(int64_t eval_samples, int64_t micro_batch_size,
                                                   int64_t max_batches, int rank, int world_size);

}  // namespace trainstep

#endif  // TRAINSTEP_CORE_WINDOW_PLAN_H_
