// The checkpoint directory: one sub-directory per checkpoint, made visible only once complete.
//
//   dir/ckpt-<id>/{model.safetensors, optimizer.safetensors, meta.json}
//
// A checkpoint is written into dir/.ckpt-<id>.tmp-<pid>, every file and the temp dir are fsynced,
// and only then is it renamed to ckpt-<id> and dir fsynced: a crash leaves either no ckpt-<id>
// or a complete one, plus a dot-named leftover that readers ignore and later writes prune.
// Not safe for two processes writing the same dir at once (only rank 0 writes checkpoints).
//
// A directory belongs to one job: dir/.trainstep-job holds its id (ClaimCheckpointDir), every
// write checks it, and pruning deletes only ckpt-<id> whose meta.json names that job. So a
// spec pointed at someone else's checkpoints, or a second job sharing a directory, deletes
// nothing it did not write.
#ifndef TRAINSTEP_WORKER_CHECKPOINT_CHECKPOINT_DIR_H_
#define TRAINSTEP_WORKER_CHECKPOINT_CHECKPOINT_DIR_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/env.h"
#include "common/hf_weights.h"
#include "worker/checkpoint/checkpoint_meta.h"
#include "worker/checkpoint/safetensors.h"

namespace trainstep::ckpt {

// "ckpt-<id>", the directory name of checkpoint `id`.
std::string CheckpointDirName(int64_t checkpoint_id);

// The claim marker's name inside a checkpoint directory.
inline constexpr char kClaimFile[] = ".trainstep-job";

// Makes `dir` (created if needed) the directory of `job_id`, durably: the marker is written to a
// temp file, fsynced, renamed in and `dir` fsynced. OK if `dir` is already claimed by `job_id`.
// FAILED_PRECONDITION naming the directory and the other job when the marker names another
// job, or when an unclaimed `dir` holds a ckpt-<id> (or a leftover) that another job wrote
// (checkpoints written before markers existed are claimed by the job their meta.json names).
absl::Status ClaimCheckpointDir(const std::string& dir, const std::string& job_id,
                                Env* env = Env::Default());

// Files a model keeps beside its weights (a Hugging Face config.json), by name: contents.
using ExtraFiles = std::map<std::string, std::string>;

struct WriteOptions {
  ExtraFiles extra_files;
  // Above this many bytes of model tensors, model.safetensors is written as Hugging Face's
  // shards and index (model-00001-of-0000N.safetensors, model.safetensors.index.json).
  uint64_t max_shard_bytes = kHfDefaultMaxShardBytes;
};

// Writes dir/ckpt-<meta.checkpoint_id> as described above, options.extra_files included (meta.json
// last, with the XXH64 of every other file in place of meta.file_xxh64), creating
// `dir` if needed, and returns its path, after claiming `dir` for meta.job_id (ClaimCheckpointDir's
// errors). An existing checkpoint of the same id is replaced: the new one is renamed in right after
// the old one is renamed aside (the only moment neither is visible), and the old one is put back if
// that rename fails. Afterwards, best effort (failures are logged, the write still succeeds):
// deletes the lowest-id ckpt-* of meta.job_id beyond `keep_last` (0 keeps all; never the one just
// written; another job's are neither counted nor deleted) and dot-named leftovers of lower ids (in
// a claimed directory, only this job's writers leave them). INVALID_ARGUMENT for a negative id or
// keep_last, a non-finite loss_scale, or a tensor the safetensors writer rejects, or an extra file
// that is not a plain name or would replace one of the checkpoint's own files.
absl::StatusOr<std::string> WriteCheckpoint(const std::string& dir, const CheckpointMeta& meta,
                                            const TensorMap& model, const TensorMap& optimizer,
                                            int keep_last, Env* env = Env::Default(),
                                            const WriteOptions& options = {});

struct LoadedCheckpoint {
  CheckpointMeta meta;
  TensorMap model;
  TensorMap optimizer;
  std::string path;  // dir/ckpt-<id>
};

// NOT_FOUND if the checkpoint does not exist. DATA_LOSS (naming the file) if it is damaged: a
// file missing, malformed, or not hashing to the XXH64 meta.json recorded when it was written, or
// meta.json's checkpoint_id not `checkpoint_id`. Sharded model weights are read through their
// index (memory-mapped, outside `env`), and the digests are checked outside `env` too.
absl::StatusOr<LoadedCheckpoint> ReadCheckpoint(const std::string& dir, int64_t checkpoint_id,
                                                Env* env = Env::Default());

// The highest id whose ckpt-<id> has all three files, they parse (meta.json naming the same id)
// and hash to meta.json's digests; incomplete or corrupt ones are skipped with a warning,
// dot-named leftovers ignored.
// nullopt if there is none or `dir` does not exist. Reads every file of the candidates it
// checks in full.
absl::StatusOr<std::optional<int64_t>> LatestCheckpoint(const std::string& dir,
                                                        Env* env = Env::Default());

}  // namespace trainstep::ckpt

#endif  // TRAINSTEP_WORKER_CHECKPOINT_CHECKPOINT_DIR_H_
