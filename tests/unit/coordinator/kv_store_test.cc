#include "coordinator/kv_store.h"

#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace trainstep {
namespace {

// Catches: Get returning something for a missing key, or Set not overwriting.
TEST(KvStoreTest, SetGet) {
  KvStore s;
  EXPECT_EQ(s.Get("k"), std::nullopt);
  s.Set("k", "v1");
  EXPECT_EQ(s.Get("k"), "v1");
  s.Set("k", std::string("a\0b", 3));  // values are bytes
  EXPECT_EQ(s.Get("k"), std::string("a\0b", 3));
  EXPECT_EQ(s.size(), 1);
}

// Catches: add() keeping a binary integer (c10d reads the value as a decimal string), a
// missing key not counting as 0, or a non-integer value silently reset.
TEST(KvStoreTest, AddKeepsDecimalString) {
  KvStore s;
  EXPECT_EQ(*s.Add("n", 5), 5);
  EXPECT_EQ(s.Get("n"), "5");
  EXPECT_EQ(*s.Add("n", -7), -2);
  EXPECT_EQ(s.Get("n"), "-2");
  s.Set("m", "40");  // a value set as text counts as that number
  EXPECT_EQ(*s.Add("m", 2), 42);
  EXPECT_EQ(*s.Add("m", 0), 42);
  s.Set("x", "abc");
  absl::StatusOr<int64_t> bad = s.Add("x", 1);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.Get("x"), "abc");
}

// Catches the probe's StoreAdd wrapping past 2^63-1 (a counter handed out twice, negative).
TEST(KvStoreTest, AddRefusesToWrap) {
  KvStore s;
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(*s.Add("n", kMax), kMax);
  absl::StatusOr<int64_t> wrapped = s.Add("n", 1);
  EXPECT_EQ(wrapped.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_NE(std::string(wrapped.status().message()).find("\"n\""), std::string::npos);
  EXPECT_EQ(s.Get("n"), absl::StrCat(kMax));  // unchanged
  EXPECT_EQ(*s.Add("n", -kMax), 0);
  EXPECT_EQ(*s.Add("m", std::numeric_limits<int64_t>::min()), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(s.Add("m", -1).status().code(), absl::StatusCode::kOutOfRange);
}

// Catches: compareSet deviating from c10d: missing key with empty expected must set; missing
// key with non-empty expected returns expected and sets nothing; a mismatch returns the
// current value unchanged.
TEST(KvStoreTest, CompareSetFollowsC10d) {
  KvStore s;
  EXPECT_EQ(s.CompareSet("k", "", "first"), "first");
  EXPECT_EQ(s.Get("k"), "first");

  EXPECT_EQ(s.CompareSet("missing", "exp", "des"), "exp");
  EXPECT_EQ(s.Get("missing"), std::nullopt);

  EXPECT_EQ(s.CompareSet("k", "wrong", "second"), "first");
  EXPECT_EQ(s.Get("k"), "first");
  EXPECT_EQ(s.CompareSet("k", "first", "second"), "second");
  EXPECT_EQ(s.Get("k"), "second");
  // An existing empty value matches an empty expected.
  s.Set("e", "");
  EXPECT_EQ(s.CompareSet("e", "", "filled"), "filled");
}

// Catches: check() true when only some keys exist.
TEST(KvStoreTest, HasAll) {
  KvStore s;
  EXPECT_TRUE(s.HasAll({}));
  s.Set("a", "1");
  EXPECT_TRUE(s.HasAll({"a"}));
  EXPECT_FALSE(s.HasAll({"a", "b"}));
  s.Set("b", "2");
  EXPECT_TRUE(s.HasAll({"b", "a"}));
}

// Catches: delete reporting success for a missing key, or not deleting.
TEST(KvStoreTest, Delete) {
  KvStore s;
  s.Set("a", "1");
  EXPECT_TRUE(s.Delete("a"));
  EXPECT_FALSE(s.Delete("a"));
  EXPECT_EQ(s.Get("a"), std::nullopt);
  EXPECT_EQ(s.size(), 0);
}

// Catches: a finished generation's rendezvous keys surviving (a new generation would find
// stale ranks), or KeepOnly dropping the new generation's keys.
TEST(KvStoreTest, KeepOnlyDropsOtherPrefixes) {
  KvStore s;
  s.Set("job-1/g1/rank0", "x");
  s.Set("job-1/g1/rank1", "x");
  s.Set("job-1/g2/rank0", "y");
  s.Set("other", "z");
  s.KeepOnly("job-1/g2/");
  EXPECT_EQ(s.size(), 1);
  EXPECT_EQ(s.Get("job-1/g2/rank0"), "y");
  EXPECT_EQ(s.Get("job-1/g1/rank0"), std::nullopt);
}

// Catches: a mutation that does not bump the version (a waiting StoreGet would never wake).
TEST(KvStoreTest, VersionBumpsOnEveryChange) {
  KvStore s;
  uint64_t v = s.version();
  s.Set("a", "1");
  EXPECT_GT(s.version(), v);
  v = s.version();
  ASSERT_TRUE(s.Add("n", 1).ok());
  EXPECT_GT(s.version(), v);
  v = s.version();
  s.CompareSet("c", "", "1");
  EXPECT_GT(s.version(), v);
  v = s.version();
  s.CompareSet("c", "nope", "2");
  EXPECT_EQ(s.version(), v);  // nothing changed
  s.Delete("a");
  EXPECT_GT(s.version(), v);
}

}  // namespace
}  // namespace trainstep
