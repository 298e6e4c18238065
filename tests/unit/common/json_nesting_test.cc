#include "common/json_nesting.h"

#include <gtest/gtest.h>

#include <string>

namespace trainstep {
namespace {

// Catches nesting checks fooled by brackets inside strings (they must not count).
TEST(JsonNestingTest, IgnoresBracketsInStrings) {
  EXPECT_TRUE(CheckJsonNesting(R"({"[[[[": "{{{{\"[[["})", 1).ok());
  EXPECT_TRUE(CheckJsonNesting(R"({'a"[[[': 1})", 1).ok());
  EXPECT_FALSE(CheckJsonNesting(R"({"a": [[1]]})", 2).ok());
}

// Catches a bound that is off by one, or a message that does not say where.
TEST(JsonNestingTest, BoundIsInclusiveAndNamesTheByte) {
  EXPECT_TRUE(CheckJsonNesting("[[[]]]", 3).ok());
  EXPECT_EQ(CheckJsonNesting("[[[[]]]]", 3).message(),
            "JSON nests deeper than 3 levels (at byte 3)");
  EXPECT_TRUE(CheckJsonNesting(std::string(100000, '[').substr(0, 0), 1).ok());
}

}  // namespace
}  // namespace trainstep
