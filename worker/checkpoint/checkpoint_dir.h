// The checkpoint directory: one sub-directory per checkpoint, made visible only once complete.
//
//   dir/ckpt-<id>/{model.safetensors, optimizer.safetensors, meta.json}
//
// A checkpoint is written into dir/.ckpt-<id>.tmp-<pid>, every file and the temp dir are fsynced,
// and only then is it renamed to ckpt-<id> and dir fsynced: a crash leaves either no ckpt-<id>
// or a complete one, plus a dot-named leftover that readers ignore and later writes prune.
// Not safe for two processes writing the same dir at once (only rank 0 writes checkpoints).
#ifndef TRAINSTEP_WORKER_CHECKPOINT_CHECKPOINT_DIR_H_
#define TRAINSTEP_WORKER_CHECKPOINT_CHECKPOINT_DIR_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/env.h"
#include "worker/checkpoint/safetensors.h"

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

  friend bool operator==(const CheckpointMeta& a, const CheckpointMeta& b);
  friend bool operator!=(const CheckpointMeta& a, const CheckpointMeta& b) { return !(a == b); }
};

// "ckpt-<id>", the directory name of checkpoint `id`.
std::string CheckpointDirName(int64_t checkpoint_id);

// meta.json's exact text, and its parser (INVALID_ARGUMENT naming the field on any problem).
absl::StatusOr<std::string> CheckpointMetaToJson(const CheckpointMeta& meta);
absl::StatusOr<CheckpointMeta> CheckpointMetaFromJson(absl::string_view json);

// Writes dir/ckpt-<meta.checkpoint_id> as described above, creating `dir` if needed, and
// returns its path. An existing checkpoint of the same id is replaced: the new one is renamed
// in right after the old one is renamed aside (the only moment neither is visible), and the
// old one is put back if that rename fails. Afterwards, best effort (failures are logged, the
// write still succeeds): deletes the lowest-id ckpt-* beyond `keep_last` (0 keeps all; never the
// one just written) and dot-named leftovers of lower ids. INVALID_ARGUMENT for a negative id or
// keep_last, a non-finite loss_scale, or a tensor the safetensors writer rejects.
absl::StatusOr<std::string> WriteCheckpoint(const std::string& dir, const CheckpointMeta& meta,
                                            const TensorMap& model, const TensorMap& optimizer,
                                            int keep_last, Env* env = Env::Default());

struct LoadedCheckpoint {
  CheckpointMeta meta;
  TensorMap model;
  TensorMap optimizer;
  std::string path;  // dir/ckpt-<id>
};

// NOT_FOUND if the checkpoint does not exist; INVALID_ARGUMENT (naming the file) if a file is
// malformed or meta.json's checkpoint_id is not `checkpoint_id`.
absl::StatusOr<LoadedCheckpoint> ReadCheckpoint(const std::string& dir, int64_t checkpoint_id,
                                                Env* env = Env::Default());

// The highest id whose ckpt-<id> has all three files and they parse (meta.json naming the same
// id); incomplete or corrupt ones are skipped with a warning, dot-named leftovers ignored.
// nullopt if there is none or `dir` does not exist. Reads every file of the candidates it
// checks in full.
absl::StatusOr<std::optional<int64_t>> LatestCheckpoint(const std::string& dir,
                                                        Env* env = Env::Default());

}  // namespace trainstep::ckpt

#endif  // TRAINSTEP_WORKER_CHECKPOINT_CHECKPOINT_DIR_H_
