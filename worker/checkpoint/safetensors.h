// Our own reader and writer of the safetensors format (https://github.com/huggingface/safetensors):
// an 8-byte little-endian header length N, N bytes of JSON header (padded with spaces to a
// multiple of 8), then the tensors' raw little-endian bytes packed in header order.
// The reader treats every file as hostile: it validates the whole header against the file size
// before it allocates anything, and never reads outside the buffer it was given.
#ifndef TRAINSTEP_WORKER_CHECKPOINT_SAFETENSORS_H_
#define TRAINSTEP_WORKER_CHECKPOINT_SAFETENSORS_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/env.h"

namespace trainstep::ckpt {

// Ordered maps, so the same tensors always serialize to the same bytes.
using TensorMap = std::map<std::string, at::Tensor>;
using Metadata = std::map<std::string, std::string>;

// The reference implementation's limit; a longer header is rejected before it is parsed.
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

// Dtypes: F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL. Any other dtype, an undefined or
// non-strided tensor, or the reserved name "__metadata__" is INVALID_ARGUMENT naming the tensor.
// Non-contiguous or non-CPU tensors are written from contiguous CPU copies.
absl::StatusOr<std::string> SerializeSafetensors(const TensorMap& tensors,
                                                 const Metadata& metadata = {});

// Tensors come back on the CPU, contiguous, owning their memory (never aliasing `bytes`).
// Malformed input is INVALID_ARGUMENT naming the tensor and the problem. `metadata`, if
// non-null, receives "__metadata__" (empty if absent) and is only written on success.
absl::StatusOr<TensorMap> ParseSafetensors(absl::string_view bytes, Metadata* metadata = nullptr);

// Every check ParseSafetensors makes, without allocating the tensors.
absl::Status ValidateSafetensors(absl::string_view bytes);

// Writes `path` through `env` and fsyncs it (the caller syncs the directory). The file is
// streamed tensor by tensor: no second copy of the data is built in memory.
absl::Status WriteSafetensorsFile(const std::string& path, const TensorMap& tensors,
                                  const Metadata& metadata = {}, Env* env = Env::Default());

// Errors about the contents name `path`.
absl::StatusOr<TensorMap> ReadSafetensorsFile(const std::string& path, Metadata* metadata = nullptr,
                                              Env* env = Env::Default());

namespace internal {

// Shared with checkpoint_dir.cc. INVALID_ARGUMENT if JSON `text` nests arrays/objects deeper
// than `max_depth`: protobuf's JSON parser takes minutes on deeply nested input, so hostile
// text is bounded by a linear scan first. Other syntax errors are left to the parser.
absl::Status CheckJsonNesting(absl::string_view text, int max_depth);

// Strict UTF-8: no overlong forms, no surrogates, nothing above U+10FFFF.
bool IsValidUtf8(absl::string_view s);

}  // namespace internal
}  // namespace trainstep::ckpt

#endif  // TRAINSTEP_WORKER_CHECKPOINT_SAFETENSORS_H_
