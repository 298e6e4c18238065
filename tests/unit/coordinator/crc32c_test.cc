#include "coordinator/crc32c.h"

#include <cstdint>
#include <random>
#include <string>

#include "gtest/gtest.h"

namespace trainstep {
namespace {

// Bit-at-a-time CRC32C, the definition the table-driven code must agree with.
uint32_t ReferenceCrc32c(const std::string& data) {
  uint32_t crc = ~0u;
  for (unsigned char c : data) {
    crc ^= c;
    for (int i = 0; i < 8; ++i) crc = (crc >> 1) ^ ((crc & 1) ? 0x82F63B78u : 0);
  }
  return ~crc;
}

// Catches a wrong polynomial, a missing pre/post inversion, or a non-reflected table.
TEST(Crc32cTest, StandardCheckValue) { EXPECT_EQ(Crc32c("123456789"), 0xE3069283u); }

// Catches errors that only show on long runs of identical bytes (RFC 3720 B.4 vectors).
TEST(Crc32cTest, Rfc3720Vectors) {
  EXPECT_EQ(Crc32c(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(Crc32c(std::string(32, '\xff')), 0x62A8AB43u);
  std::string ascending, descending;
  for (int i = 0; i < 32; ++i) {
    ascending.push_back(static_cast<char>(i));
    descending.push_back(static_cast<char>(31 - i));
  }
  EXPECT_EQ(Crc32c(ascending), 0x46DD794Eu);
  EXPECT_EQ(Crc32c(descending), 0x113FDB5Cu);
}

// Catches an empty input returning something other than 0 (the journal frames empty records).
TEST(Crc32cTest, EmptyIsZero) { EXPECT_EQ(Crc32c(""), 0u); }

// Catches slicing-by-8 bugs in the 8-byte loop or the tail, at every length and alignment.
TEST(Crc32cTest, MatchesBitwiseReferenceAtEveryLengthAndOffset) {
  std::mt19937 rng(42);
  std::string data(300, '\0');
  for (char& c : data) c = static_cast<char>(rng());
  for (size_t offset = 0; offset < 8; ++offset) {
    for (size_t len = 0; offset + len <= data.size(); len += (len < 40 ? 1 : 13)) {
      const std::string piece = data.substr(offset, len);
      ASSERT_EQ(Crc32c(piece), ReferenceCrc32c(piece)) << "offset " << offset << " len " << len;
    }
  }
}

// Catches Extend not continuing from the previous CRC (it must equal one pass over A+B).
TEST(Crc32cTest, ExtendEqualsOnePass) {
  const std::string data = "hello world, a somewhat longer string to split at every point";
  for (size_t cut = 0; cut <= data.size(); ++cut) {
    EXPECT_EQ(Crc32cExtend(Crc32c(data.substr(0, cut)), data.substr(cut)), Crc32c(data))
        << "cut " << cut;
  }
}

// Catches a mask that is not invertible or leaves the CRC unchanged.
TEST(Crc32cTest, MaskRoundTripsAndChangesValue) {
  const uint32_t crc = Crc32c("foo");
  EXPECT_NE(MaskCrc(crc), crc);
  EXPECT_NE(MaskCrc(MaskCrc(crc)), crc);
  EXPECT_EQ(UnmaskCrc(MaskCrc(crc)), crc);
  EXPECT_EQ(UnmaskCrc(UnmaskCrc(MaskCrc(MaskCrc(crc)))), crc);
  for (uint32_t v : {0u, 1u, 0x80000000u, 0xffffffffu, 0xE3069283u})
    EXPECT_EQ(UnmaskCrc(MaskCrc(v)), v);
}

}  // namespace
}  // namespace trainstep
