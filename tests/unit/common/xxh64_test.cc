#include "common/xxh64.h"

#include <gtest/gtest.h>

#include <string>

namespace trainstep {
namespace {

// Published values (xxHash's own and python-xxhash's examples). Catches: a wrong constant,
// the short-input path (< 32 bytes) or the stripe path (≥ 32) computed differently from
// xxHash, so fingerprints would not match `xxhsum -H1`.
TEST(Xxh64Test, KnownValues) {
  EXPECT_EQ(Xxh64Of(""), 0xEF46DB3751D8E999ULL);
  EXPECT_EQ(Xxh64Of("a"), 0xD24EC4F1A98C6E5BULL);
  EXPECT_EQ(Xxh64Of("xxhash"), 0x32DD38952C4BC720ULL);
  EXPECT_EQ(Xxh64Of("xxhash", 20141025), 0xB559B98D844E0635ULL);
  EXPECT_EQ(Xxh64Of("Nobody inspects the spammish repetition"), 0xFBCEA83C8A378BF1ULL);
}

// Catches: state lost between Update calls (the 32-byte buffer), so a file hashed in blocks
// would fingerprint differently from the same bytes hashed at once.
TEST(Xxh64Test, StreamingEqualsOneShotForEverySplit) {
  std::string data;
  for (int i = 0; i < 200; ++i) data.push_back(static_cast<char>(i * 37 + 11));
  const uint64_t whole = Xxh64Of(data, 7);
  for (size_t a = 0; a <= data.size(); a += 13) {
    for (size_t b = a; b <= data.size(); b += 29) {
      Xxh64 h(7);
      h.Update(std::string_view(data).substr(0, a));
      h.Update(std::string_view(data).substr(a, b - a));
      h.Update(std::string_view(data).substr(b));
      EXPECT_EQ(h.Digest(), whole) << a << " " << b;
    }
  }
  // Every length from 0 to 200 differs from its neighbours (the length is hashed too).
  for (size_t n = 1; n <= data.size(); ++n) {
    EXPECT_NE(Xxh64Of(std::string_view(data).substr(0, n)),
              Xxh64Of(std::string_view(data).substr(0, n - 1)));
  }
}

}  // namespace
}  // namespace trainstep
