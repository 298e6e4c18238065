#ifndef TRAINSTEP_COMMON_FNV1A_H_
#define TRAINSTEP_COMMON_FNV1A_H_

// FNV-1a, 64 bits: simple, and the same on every machine and in every process. The one
// definition behind the spec hash, the dataset fingerprint and the CLI's submit request ids;
// their values are stored (journals, checkpoints), so this must never change.

#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"

namespace trainstep {

inline constexpr uint64_t kFnv1a64Offset = 0xcbf29ce484222325ULL;
inline constexpr uint64_t kFnv1a64Prime = 0x100000001b3ULL;

// Continues hash `h` over `n` bytes at `data` (start with kFnv1a64Offset).
inline uint64_t Fnv1a64(const void* data, size_t n, uint64_t h = kFnv1a64Offset) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= kFnv1a64Prime;
  }
  return h;
}

inline uint64_t Fnv1a64(absl::string_view bytes, uint64_t h = kFnv1a64Offset) {
  return Fnv1a64(bytes.data(), bytes.size(), h);
}

}  // namespace trainstep

#endif  // TRAINSTEP_COMMON_FNV1A_H_
