// The Torch-free half of our safetensors support: the dtype table and the reader's validation
// of a file's header against its size, and the writer's header. The worker's LibTorch tensors
// (worker/checkpoint/safetensors.h) and the CLI's export build on it; the fuzzers and the
// sanitizer builds (which have no LibTorch) test it directly.
//
// Format: an 8-byte little-endian header length N, N bytes of JSON header (padded with spaces
// to a multiple of 8), then the tensors' raw little-endian bytes packed in header order.
// Every file is treated as hostile: the whole header is checked before anything is allocated,
// and nothing outside the given bytes is ever read.
#ifndef TRAINSTEP_COMMON_SAFETENSORS_FORMAT_H_
#define TRAINSTEP_COMMON_SAFETENSORS_FORMAT_H_

#include <google/protobuf/struct.pb.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace trainstep::ckpt {

// Ordered, so the same metadata always serializes to the same bytes.
using Metadata = std::map<std::string, std::string>;

// The reference implementation's limit; a longer header is rejected before it is parsed.
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

// The dtypes we read and write.
enum class SafetensorsDtype { kF64, kF32, kF16, kBF16, kI64, kI32, kI16, kI8, kU8, kBool };

// "F64", "F32", ... as the format spells them.
const char* SafetensorsDtypeName(SafetensorsDtype dtype);
std::optional<SafetensorsDtype> SafetensorsDtypeFromName(absl::string_view name);
size_t SafetensorsElementSize(SafetensorsDtype dtype);
// "F64, F32, ..." for error messages.
std::string SupportedSafetensorsDtypes();

// One tensor of a validated header: its bytes are data[begin, end) of SafetensorsHeader::data.
struct SafetensorsEntry {
  std::string name;
  SafetensorsDtype dtype = SafetensorsDtype::kF32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;
  uint64_t end = 0;
};

struct SafetensorsHeader {
  std::vector<SafetensorsEntry> entries;  // Sorted by name.
  Metadata metadata;                      // "__metadata__" (empty if absent).
  absl::string_view data;                 // The bytes after the header (aliases the input).
};

// Every check the reader makes: the header parses, names each tensor once with a known
// dtype, a shape of at most 2^62 elements and data_offsets that pack the data section exactly
// (no gap, no overlap, nothing left over), and BOOL bytes are 0 or 1. Malformed input is
// INVALID_ARGUMENT naming the tensor and the problem.
absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(absl::string_view bytes);

// ParseSafetensorsHeader's status.
absl::Status ValidateSafetensors(absl::string_view bytes);

// A tensor as a writer declares it; its bytes (little-endian, row-major) follow the header.
struct SafetensorsTensorInfo {
  std::string name;
  SafetensorsDtype dtype = SafetensorsDtype::kF32;
  std::vector<int64_t> shape;
};

// The start of a file holding `tensors` in this order: the 8-byte little-endian length and the
// JSON header, padded with spaces so the data starts 8-byte aligned (as the reference writer
// does). The tensors' bytes follow, packed in the same order. The file then parses with
// ParseSafetensorsHeader when `tensors` are sorted by name (the reader's order). INVALID_ARGUMENT
// naming the tensor for the reserved name "__metadata__", a name or metadata that is not valid
// UTF-8, a negative dimension, or a header over kMaxSafetensorsHeaderBytes. `*data_bytes`, if
// non-null, receives the size of the data section.
absl::StatusOr<std::string> SafetensorsFilePrefix(const std::vector<SafetensorsTensorInfo>& tensors,
                                                  const Metadata& metadata,
                                                  uint64_t* data_bytes = nullptr);

namespace internal {

// Tensor names come from files: 'name' with non-printable bytes escaped, so an error message
// stays one printable line.
std::string QuotedName(absl::string_view name);
// INVALID_ARGUMENT "tensor 'name': problem".
absl::Status TensorError(absl::string_view name, absl::string_view problem);

// A JSON object read from a file (`what` names it in errors: "header", "meta.json"), nesting
// bounded by CheckJsonNesting (common/json_nesting.h) first. INVALID_ARGUMENT "<what> is invalid:
// JSON nests deeper …" or "<what> is not valid JSON: …".
absl::StatusOr<google::protobuf::Struct> ParseJsonObject(absl::string_view json, int max_depth,
                                                         absl::string_view what);

// Strict UTF-8: no overlong forms, no surrogates, nothing above U+10FFFF.
bool IsValidUtf8(absl::string_view s);

}  // namespace internal
}  // namespace trainstep::ckpt

#endif  // TRAINSTEP_COMMON_SAFETENSORS_FORMAT_H_
