#include "coordinator/store/kv_store.h"

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
  ASSERT_TRUE(s.Set("k", "v1").ok());
  EXPECT_EQ(s.Get("k"), "v1");
  ASSERT_TRUE(s.Set("k", std::string("a\0b", 3)).ok());  // values are bytes
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
  ASSERT_TRUE(s.Set("m", "40").ok());  // a value set as text counts as that number
  EXPECT_EQ(*s.Add("m", 2), 42);
  EXPECT_EQ(*s.Add("m", 0), 42);
  ASSERT_TRUE(s.Set("x", "abc").ok());
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
  EXPECT_EQ(*s.CompareSet("k", "", "first"), "first");
  EXPECT_EQ(s.Get("k"), "first");

  EXPECT_EQ(*s.CompareSet("missing", "exp", "des"), "exp");
  EXPECT_EQ(s.Get("missing"), std::nullopt);

  EXPECT_EQ(*s.CompareSet("k", "wrong", "second"), "first");
  EXPECT_EQ(s.Get("k"), "first");
  EXPECT_EQ(*s.CompareSet("k", "first", "second"), "second");
  EXPECT_EQ(s.Get("k"), "second");
  // An existing empty value matches an empty expected.
  ASSERT_TRUE(s.Set("e", "").ok());
  EXPECT_EQ(*s.CompareSet("e", "", "filled"), "filled");
}

// Catches: check() true when only some keys exist.
TEST(KvStoreTest, HasAll) {
  KvStore s;
  EXPECT_TRUE(s.HasAll({}));
  ASSERT_TRUE(s.Set("a", "1").ok());
  EXPECT_TRUE(s.HasAll({"a"}));
  EXPECT_FALSE(s.HasAll({"a", "b"}));
  ASSERT_TRUE(s.Set("b", "2").ok());
  EXPECT_TRUE(s.HasAll({"b", "a"}));
}

// Catches: delete reporting success for a missing key, or not deleting.
TEST(KvStoreTest, Delete) {
  KvStore s;
  ASSERT_TRUE(s.Set("a", "1").ok());
  EXPECT_TRUE(s.Delete("a"));
  EXPECT_FALSE(s.Delete("a"));
  EXPECT_EQ(s.Get("a"), std::nullopt);
  EXPECT_EQ(s.size(), 0);
}

// Catches: a finished generation's rendezvous keys surviving (a new generation would find
// stale ranks), or KeepOnly dropping the new generation's keys.
TEST(KvStoreTest, KeepOnlyDropsOtherPrefixes) {
  KvStore s;
  ASSERT_TRUE(s.Set("job-1/g1/rank0", "x").ok());
  ASSERT_TRUE(s.Set("job-1/g1/rank1", "x").ok());
  ASSERT_TRUE(s.Set("job-1/g2/rank0", "y").ok());
  ASSERT_TRUE(s.Set("other", "z").ok());
  s.KeepOnly("job-1/g2/");
  EXPECT_EQ(s.size(), 1);
  EXPECT_EQ(s.Get("job-1/g2/rank0"), "y");
  EXPECT_EQ(s.Get("job-1/g1/rank0"), std::nullopt);
}

// Catches: a mutation that does not bump the version (a waiting StoreGet would never wake).
TEST(KvStoreTest, VersionBumpsOnEveryChange) {
  KvStore s;
  uint64_t v = s.version();
  ASSERT_TRUE(s.Set("a", "1").ok());
  EXPECT_GT(s.version(), v);
  v = s.version();
  ASSERT_TRUE(s.Add("n", 1).ok());
  EXPECT_GT(s.version(), v);
  v = s.version();
  ASSERT_TRUE(s.CompareSet("c", "", "1").ok());
  EXPECT_GT(s.version(), v);
  v = s.version();
  ASSERT_TRUE(s.CompareSet("c", "nope", "2").ok());
  EXPECT_EQ(s.version(), v);  // nothing changed
  s.Delete("a");
  EXPECT_GT(s.version(), v);
}

// Catches the probe's unbounded store (100 k keys grew the coordinator without limit): the
// key limit refuses new keys with RESOURCE_EXHAUSTED naming the flag, yet overwrites of
// existing keys and writes after a delete still work.
TEST(KvStoreTest, KeyLimitRefusesNewKeysOnly) {
  KvStore s(/*max_keys=*/3, /*max_bytes=*/0);
  for (const char* k : {"a", "b", "c"}) ASSERT_TRUE(s.Set(k, "1").ok());
  absl::Status refused = s.Set("d", "1");
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(std::string(refused.message()).find("--store-max-keys 3"), std::string::npos)
      << refused;
  EXPECT_EQ(s.Add("e", 1).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(s.CompareSet("f", "", "1").status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(s.size(), 3);
  EXPECT_EQ(s.Get("d"), std::nullopt);
  EXPECT_TRUE(s.Set("a", "2").ok());  // an overwrite adds no key
  EXPECT_TRUE(s.Add("b", 5).ok());
  EXPECT_TRUE(s.Delete("c"));
  EXPECT_TRUE(s.Set("d", "1").ok());
}

// Catches the probe's 201 x 1 MB values: the byte limit counts keys and values, refuses the
// write that would cross it (leaving the old value), and frees what Delete and KeepOnly drop.
TEST(KvStoreTest, ByteLimitCountsKeysAndValues) {
  KvStore s(/*max_keys=*/0, /*max_bytes=*/100);
  ASSERT_TRUE(s.Set("k1", std::string(48, 'x')).ok());  // 50 bytes
  EXPECT_EQ(s.bytes(), 50);
  ASSERT_TRUE(s.Set("k2", std::string(48, 'y')).ok());  // 100: exactly the limit
  absl::Status refused = s.Set("k3", "");               // the key alone crosses it
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(std::string(refused.message()).find("--store-max-bytes"), std::string::npos);
  EXPECT_EQ(s.Set("k1", std::string(49, 'x')).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(s.Get("k1"), std::string(48, 'x'));
  ASSERT_TRUE(s.Set("k1", "small").ok());  // shrinking is always allowed
  EXPECT_EQ(s.bytes(), 57);
  EXPECT_TRUE(s.Delete("k2"));
  EXPECT_EQ(s.bytes(), 7);
  ASSERT_TRUE(s.Set("p/a", std::string(90, 'z')).ok());
  s.KeepOnly("p/");
  EXPECT_EQ(s.bytes(), 93);
}

}  // namespace
}  // namespace trainstep
