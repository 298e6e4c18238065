// CRC32C (Castagnoli) checksums for the journal and checkpoint framing.
#ifndef TRAINSTEP_COORDINATOR_CRC32C_H_
#define TRAINSTEP_COORDINATOR_CRC32C_H_

#include <cstdint>
#include <string_view>

namespace trainstep {

// Returns crc32c(A + data) given crc = crc32c(A). Crc32cExtend(0, data) == Crc32c(data).
uint32_t Crc32cExtend(uint32_t crc, std::string_view data);

inline uint32_t Crc32c(std::string_view data) { return Crc32cExtend(0, data); }

// A CRC of bytes that themselves embed CRCs is weak, so stored CRCs are masked (as in LevelDB).
inline constexpr uint32_t kCrc32cMaskDelta = 0xa282ead8u;

inline uint32_t MaskCrc(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + kCrc32cMaskDelta; }

inline uint32_t UnmaskCrc(uint32_t masked) {
  const uint32_t rot = masked - kCrc32cMaskDelta;
  return (rot >> 17) | (rot << 15);
}

}  // namespace trainstep

#endif  // TRAINSTEP_COORDINATOR_CRC32C_H_
