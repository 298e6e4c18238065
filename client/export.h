// `trainstep checkpoint export`: a llama job's checkpoint (fp32 master weights with Hugging Face
// names) written as a Hugging Face model directory in a chosen dtype, single-file or sharded as
// transformers' save_pretrained lays it out. Torch-free: the dtype conversions are done on bits.
// Every input file is hostile; the output appears whole or not at all.
#ifndef TRAINSTEP_CLIENT_EXPORT_H_
#define TRAINSTEP_CLIENT_EXPORT_H_

#include <cstdint>
#include <iosfwd>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/env.h"

namespace trainstep::client {

// transformers' default max_shard_size ("5GB", 1000-based).
inline constexpr uint64_t kDefaultMaxShardBytes = 5'000'000'000;

struct ExportOptions {
  std::string checkpoint_dir;  // ckpt-<id>/: config.json and model.safetensors
  std::string out_dir;         // must not exist, or be an empty directory
  // "float32", "bfloat16" or "float16"; "" = the checkpoint's trainstep_source_dtype, else
  // float32.
  std::string dtype;
  // Tensors are packed into files of at most this many tensor bytes (one larger tensor gets a
  // file of its own); everything within it gives a single model.safetensors.
  uint64_t max_shard_bytes = kDefaultMaxShardBytes;
};

// Writes options.out_dir: config.json (torch_dtype = the exported dtype) and model.safetensors,
// or model-0000i-of-0000N.safetensors plus model.safetensors.index.json when the tensors exceed
// max_shard_bytes. F32 tensors become the chosen dtype; other dtypes are copied as they are.
// Everything is written into the sibling "<out_dir>.tmp-<pid>", synced, and renamed into place;
// on failure the temporary directory is removed. One line per file written, and a summary, go
// to `progress`. Errors name the file: INVALID_ARGUMENT for a bad checkpoint or option,
// FAILED_PRECONDITION for an --out in the way, the OS error's code otherwise.
absl::Status ExportCheckpoint(const ExportOptions& options, std::ostream& progress,
                              Env* env = Env::Default());

// "5GB", "500MB", "1KB" (1000-based, as transformers reads them), "2GiB", "64MiB", "1KiB",
// "123" or "123B" (bytes); suffixes in any case. INVALID_ARGUMENT for 0, a negative number,
// anything else, or a size over 2^64 - 1.
absl::StatusOr<uint64_t> ParseByteSize(absl::string_view text);

// The dtypes --dtype accepts, and what checkpoints' configs call them.
bool IsExportDtype(absl::string_view dtype);

// fp32 → bfloat16 bits: round to nearest, ties to even; inf stays inf, overflow becomes inf, a
// NaN stays a NaN of the same sign with the quiet bit set.
uint16_t Bf16FromF32(float value);

// fp32 → IEEE binary16 bits: round to nearest, ties to even, subnormals included; a magnitude
// of 65520 or more becomes inf (as PyTorch's .to(torch.float16)); a NaN stays a NaN of the
// same sign with the quiet bit set.
uint16_t F16FromF32(float value);

}  // namespace trainstep::client

#endif  // TRAINSTEP_CLIENT_EXPORT_H_
