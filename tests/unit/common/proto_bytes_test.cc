#include "common/proto_bytes.h"

#include <google/protobuf/struct.pb.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace trainstep {
namespace {

google::protobuf::Struct WithKeys(const std::vector<std::string>& keys) {
  google::protobuf::Struct s;
  for (const std::string& k : keys) (*s.mutable_fields())[k].set_string_value("v" + k);
  return s;
}

// Catches: comparing messages by their default serialization, which writes a map's entries
// in the map's iteration order: the same Struct, built in another order, compared unequal.
TEST(ComparableBytesTest, EqualStructsBuiltInAnyOrderGiveEqualBytes) {
  std::vector<std::string> keys;
  for (int i = 0; i < 64; ++i) keys.push_back(absl::StrCat("key_", i * 7919 % 1000));
  const std::vector<std::string> reversed(keys.rbegin(), keys.rend());
  const google::protobuf::Struct a = WithKeys(keys);
  const google::protobuf::Struct b = WithKeys(reversed);
  EXPECT_EQ(ComparableBytes(a), ComparableBytes(b));
  google::protobuf::Struct copy = b;
  EXPECT_EQ(ComparableBytes(copy), ComparableBytes(a));

  google::protobuf::Struct parsed;
  ASSERT_TRUE(parsed.ParseFromString(ComparableBytes(a)));  // still the wire format
  EXPECT_EQ(ComparableBytes(parsed), ComparableBytes(a));
}

// Catches: bytes that hide a difference.
TEST(ComparableBytesTest, DifferentMessagesGiveDifferentBytes) {
  google::protobuf::Struct a = WithKeys({"x", "y"});
  google::protobuf::Struct b = a;
  (*b.mutable_fields())["y"].set_string_value("other");
  EXPECT_NE(ComparableBytes(a), ComparableBytes(b));
  EXPECT_NE(ComparableBytes(a), ComparableBytes(WithKeys({"x"})));
}

}  // namespace
}  // namespace trainstep
