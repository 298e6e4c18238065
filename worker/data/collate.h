// Turns a micro-batch's dataset indices into dense, padded row-major arrays, ready to be
// wrapped in tensors (torch::from_blob) by the caller. No LibTorch here.
#ifndef TRAINSTEP_WORKER_DATA_COLLATE_H_
#define TRAINSTEP_WORKER_DATA_COLLATE_H_

#include <cstdint>
#include <vector>

#include "worker/data/dataset.h"

namespace trainstep::data {

// One micro-batch. Token-level data fills input_ids/labels (rows × length); sample-level data
// fills features (rows × feature_dim) and targets (rows × target_dim).
struct MicroBatch {
  int64_t rows = 0;
  // Token-level: the longest sample of this micro-batch; shorter rows are right-padded.
  int64_t length = 0;
  std::vector<int64_t> input_ids;  // padded with 0 (any id would do: its label is ignored)
  std::vector<int64_t> labels;     // padded with kIgnoreLabel
  int64_t feature_dim = 0;
  int64_t target_dim = 0;
  std::vector<float> features;
  std::vector<float> targets;
  // Σ ValidTokens of the rows (token-level; 0 for sample-level). Padding adds none: a padded
  // position's label is kIgnoreLabel.
  int64_t valid_tokens = 0;
  int64_t samples = 0;  // == rows
};

// The samples `indices` of `data`, in that order (each 0 ≤ i < data.size()). Empty indices
// give an empty micro-batch (rows 0).
MicroBatch Collate(const Dataset& data, const std::vector<int64_t>& indices);

}  // namespace trainstep::data

#endif  // TRAINSTEP_WORKER_DATA_COLLATE_H_
