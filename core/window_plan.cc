#include "core/window_plan.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "core/random.h"
#include "core/spec.h"

namespace trainstep {

int64_t WindowsPerEpoch(int64_t dataset_size, int64_t global_batch, bool drop_tail) {
  if (dataset_size <= 0 || global_batch <= 0) return 0;
  return drop_tail ? dataset_size / global_batch : (dataset_size + global_batch - 1) / global_batch;
}

WindowPlanner::WindowPlanner(const v1::JobSpec& resolved, int64_t dataset_size)
    : shuffle_(resolved.data().shuffle()),
      seed_(resolved.seed()),
      micro_batch_size_(resolved.batch().micro_batch_size()),
      global_batch_(GlobalBatchSamples(resolved)),
      dataset_size_(std::max<int64_t>(dataset_size, 0)),
      windows_per_epoch_(WindowsPerEpoch(dataset_size_, global_batch_,
                                         resolved.batch().tail() == v1::Batch::drop)),
      dropped_per_epoch_(dataset_size_ -
                         std::min(dataset_size_, windows_per_epoch_ * global_batch_)) {}

int64_t WindowPlanner::EpochOf(int64_t window_id) const {
  if (window_id < 1 || windows_per_epoch_ <= 0) return 0;
  return (window_id - 1) / windows_per_epoch_;
}

int64_t WindowPlanner::WindowSize(int64_t window_id) const {
  if (window_id < 1 || windows_per_epoch_ <= 0) return 0;
  const int64_t begin = ((window_id - 1) % windows_per_epoch_) * global_batch_;
  return std::min(dataset_size_, begin + global_batch_) - begin;
}

bool WindowPlanner::IsTailWindow(int64_t window_id) const {
  const int64_t size = WindowSize(window_id);
  return size > 0 && size < global_batch_;
}

bool WindowPlanner::EndsEpoch(int64_t window_id) const {
  return window_id >= 1 && windows_per_epoch_ > 0 && window_id % windows_per_epoch_ == 0;
}

v1::DroppedTail WindowPlanner::DroppedTail(int64_t epoch) const {
  v1::DroppedTail d;
  d.set_epoch(epoch);
  d.set_samples(dropped_per_epoch_);
  d.set_first_position(dataset_size_ - dropped_per_epoch_);
  if (dropped_per_epoch_ == 0 || dropped_per_epoch_ > kMaxListedDroppedSamples) return d;
  if (shuffle_) {
    for (int64_t id : PermutationTail(dataset_size_, ShuffleSeed(epoch), dropped_per_epoch_)) {
      d.add_sample_ids(id);
    }
  } else {
    for (int64_t p = d.first_position(); p < dataset_size_; ++p) d.add_sample_ids(p);
  }
  return d;
}

uint64_t WindowPlanner::ShuffleSeed(int64_t epoch) const {
  return DeriveSeed(seed_, kShuffleStream, static_cast<uint64_t>(epoch));
}

std::shared_ptr<const std::vector<int64_t>> WindowPlanner::Order(int64_t epoch) const {
  if (!shuffle_) {
    auto order = std::make_shared<std::vector<int64_t>>(static_cast<size_t>(dataset_size_));
    std::iota(order->begin(), order->end(), int64_t{0});
    return order;
  }
  absl::MutexLock lock(&mu_);
  if (cached_epoch_ != epoch || cached_order_ == nullptr) {
    cached_order_ = std::make_shared<const std::vector<int64_t>>(
        Permutation(dataset_size_, ShuffleSeed(epoch)));
    cached_epoch_ = epoch;
  }
  return cached_order_;
}

std::vector<int64_t> WindowPlanner::EpochOrder(int64_t epoch) const {
  if (epoch < 0) return {};
  return *Order(epoch);
}

std::vector<int64_t> WindowPlanner::WindowSamples(int64_t window_id) const {
  if (window_id < 1 || windows_per_epoch_ <= 0) return {};
  const int64_t epoch = EpochOf(window_id);
  const int64_t begin = ((window_id - 1) % windows_per_epoch_) * global_batch_;
  const int64_t end = begin + WindowSize(window_id);
  if (!shuffle_) {
    std::vector<int64_t> out(static_cast<size_t>(end - begin));
    std::iota(out.begin(), out.end(), begin);
    return out;
  }
  const std::shared_ptr<const std::vector<int64_t>> order = Order(epoch);
  return std::vector<int64_t>(order->begin() + begin, order->begin() + end);
}

std::vector<std::vector<int64_t>> WindowPlanner::RankMicroBatches(int64_t window_id, int rank,
                                                                  int world_size) const {
  if (world_size < 1 || rank < 0 || rank >= world_size) return {};
  const std::vector<int64_t> window = WindowSamples(window_id);
  std::vector<std::vector<int64_t>> micro_batches;
  // Strided: with W ranks each gets every W-th sample, so a short tail window spreads over
  // as many ranks as it can instead of leaving the last ranks empty and the first ones full.
  for (size_t j = static_cast<size_t>(rank); j < window.size();
       j += static_cast<size_t>(world_size)) {
    if (micro_batches.empty() ||
        static_cast<int64_t>(micro_batches.back().size()) >= micro_batch_size_) {
      micro_batches.emplace_back();
      micro_batches.back().reserve(static_cast<size_t>(micro_batch_size_));
    }
    micro_batches.back().push_back(window[j]);
  }
  return micro_batches;
}

std::vector<std::vector<int64_t>> EvalMicroBatches(int64_t eval_samples, int64_t micro_batch_size,
                                                   int64_t max_batches, int rank, int world_size) {
  int64_t n = eval_samples;
  if (max_batches > 0 && max_batches <= n / micro_batch_size) n = max_batches * micro_batch_size;
  std::vector<std::vector<int64_t>> out;
  const int64_t batches = (n + micro_batch_size - 1) / micro_batch_size;
  for (int64_t m = rank; m < batches; m += world_size) {
    std::vector<int64_t>& mb = out.emplace_back();
    for (int64_t i = m * micro_batch_size; i < std::min(n, (m + 1) * micro_batch_size); ++i) {
      mb.push_back(i);
    }
  }
  return out;
}

}  // namespace trainstep
