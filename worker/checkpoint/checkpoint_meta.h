// A checkpoint's meta.json: the coordinator's ids and scaler state at the checkpoint, written by
// rank 0 beside the tensors and read back on resume. Torch-free, so the sanitizer builds and
// the fuzzers test the parser of these (possibly hostile) files.
#ifndef TRAINSTEP_WORKER_CHECKPOINT_CHECKPOINT_META_H_
#define TRAINSTEP_WORKER_CHECKPOINT_CHECKPOINT_META_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace trainstep::ckpt {

// Written as meta.json (pretty JSON, these names as keys) and read back exactly: integers
// beyond ±2^53 are written as decimal strings, loss_scale with round-trip precision.
struct CheckpointMeta {
  std::string job_id;
  int64_t checkpoint_id = 0;
  int64_t optimizer_update_id = 0;
  int64_t scheduler_step = 0;
  int64_t window_id = 0;
  int64_t epoch = 0;
  int64_t cumulative_tokens = 0;
  double loss_scale = 1.0;  // Must be finite: JSON has no inf or nan.
  int64_t scaler_growth_tracker = 0;
  std::string spec_hash;
  int64_t next_window_id = 0;
  int64_t written_unix_ms = 0;
  // The latest held-out evaluation (spec.eval) at or before this update: "eval_loss" (null when
  // not finite) and "eval_update_id" in meta.json, both absent when there was none.
  std::optional<double> eval_loss;
  int64_t eval_update_id = 0;
  // XXH64 of every other file of the checkpoint, by name ("xxh64" in meta.json, 16 hex digits
  // each): a file damaged after its write (a bad disk, a torn copy) is found when it is read
  // instead of training on silently. Empty in checkpoints written before it existed.
  std::map<std::string, uint64_t> file_xxh64;

  friend bool operator==(const CheckpointMeta& a, const CheckpointMeta& b);
  friend bool operator!=(const CheckpointMeta& a, const CheckpointMeta& b) { return !(a == b); }
};

// meta.json's exact text, and its parser (INVALID_ARGUMENT naming the field on any problem).
absl::StatusOr<std::string> CheckpointMetaToJson(const CheckpointMeta& meta);
absl::StatusOr<CheckpointMeta> CheckpointMetaFromJson(absl::string_view json);

}  // namespace trainstep::ckpt

#endif  // TRAINSTEP_WORKER_CHECKPOINT_CHECKPOINT_META_H_
