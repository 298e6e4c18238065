// The final weights of a job, read from its latest checkpoint, and the comparison the
// integration tests make between a run with a fault and the same job run without one.
#ifndef TRAINSTEP_TESTS_INTEGRATION_FINAL_WEIGHTS_H_
#define TRAINSTEP_TESTS_INTEGRATION_FINAL_WEIGHTS_H_

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <iostream>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "worker/checkpoint/checkpoint_dir.h"

namespace trainstep::testing {

// The model of the newest checkpoint in `ckpt_dir`, which must be of optimizer update
// `update_id` (the job's last). Empty, with a test failure, when there is none.
inline ckpt::TensorMap FinalWeights(const std::string& ckpt_dir, int64_t update_id) {
  absl::StatusOr<std::optional<int64_t>> latest = ckpt::LatestCheckpoint(ckpt_dir);
  EXPECT_TRUE(latest.ok() && latest->has_value()) << ckpt_dir;
  if (!latest.ok() || !latest->has_value()) return {};
  absl::StatusOr<ckpt::LoadedCheckpoint> l = ckpt::ReadCheckpoint(ckpt_dir, **latest);
  EXPECT_TRUE(l.ok()) << l.status();
  if (!l.ok()) return {};
  EXPECT_EQ(l->meta.optimizer_update_id, update_id);
  return l->model;
}

// Every tensor within 1e-5 of the reference, relative to max(1, its largest magnitude): the
// same samples and math, up to float summation order. Records the worst difference.
inline void ExpectSameWeights(const ckpt::TensorMap& reference, const ckpt::TensorMap& got) {
  ASSERT_EQ(reference.size(), got.size());
  double worst = 0.0;  // max|a − b| / max(1, max|a|) over the tensors, for the record
  for (const auto& [name, t] : reference) {
    const double diff = at::sub(t, got.at(name)).abs().max().item().toDouble();
    const double scale = std::max(1.0, t.abs().max().item().toDouble());
    EXPECT_LE(diff, 1e-5 * scale) << name;
    worst = std::max(worst, diff / scale);
  }
  ::testing::Test::RecordProperty("max_rel_weight_diff", absl::StrCat(worst));
  std::cout << "weights: max relative difference " << worst << "\n";
}

}  // namespace trainstep::testing

#endif  // TRAINSTEP_TESTS_INTEGRATION_FINAL_WEIGHTS_H_
