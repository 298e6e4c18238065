#include "coordinator/limits.h"

#include <string>

#include "gtest/gtest.h"

namespace trainstep {
namespace {

// Catches: a size check that is off by one or whose message does not name the field, the
// limit and the flag (users must know what to raise).
TEST(LimitsTest, CheckSizeNamesFieldLimitAndFlag) {
  EXPECT_TRUE(CheckSize("request_id", std::string(8, 'x'), 8, "--max-request-id-bytes").ok());
  absl::Status s = CheckSize("request_id", std::string(9, 'x'), 8, "--max-request-id-bytes");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "request_id is 9 bytes; the limit is 8 (--max-request-id-bytes)");
}

// Catches: a truncated failure message that exceeds the limit, cuts a UTF-8 character in
// half, or hides that it was cut.
TEST(LimitsTest, TruncateMessageStaysWithinLimitOnUtf8Boundary) {
  EXPECT_EQ(TruncateMessage("short", 300), "short");
  std::string long_message;
  for (int i = 0; i < 400; ++i) long_message += "é";  // 2 bytes each
  const std::string t = TruncateMessage(long_message, 300);
  EXPECT_LE(t.size(), 300u);
  EXPECT_NE(t.find("(truncated from 800 bytes)"), std::string::npos) << t;
  const std::string kept = t.substr(0, t.find("…"));
  EXPECT_EQ(kept.size() % 2, 0u);  // whole characters only
  for (size_t i = 0; i < kept.size(); i += 2) EXPECT_EQ(kept.substr(i, 2), "é");
}

// Catches: negative page sizes or forged tokens accepted, or the default/cap not applied.
TEST(LimitsTest, ParsePageRequest) {
  EXPECT_EQ(ParsePageRequest(0, "", 100, 1000)->size, 100);
  EXPECT_EQ(ParsePageRequest(5000, "", 100, 1000)->size, 1000);
  EXPECT_EQ(ParsePageRequest(7, "", 100, 1000)->token, -1);
  EXPECT_EQ(ParsePageRequest(7, "42", 100, 1000)->token, 42);
  EXPECT_EQ(ParsePageRequest(-1, "", 100, 1000).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParsePageRequest(0, "abc", 100, 1000).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParsePageRequest(0, "-3", 100, 1000).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Catches: a page that overflows its byte budget, or an empty page when a single entry is
// larger than the budget (a client would loop forever on it).
TEST(LimitsTest, PageHasRoomKeepsBudgetButNeverEmpty) {
  PageRequest page;
  page.size = 3;
  EXPECT_TRUE(PageHasRoom(0, 0, 5000, page, 1000));  // first entry always
  EXPECT_TRUE(PageHasRoom(1, 400, 600, page, 1000));
  EXPECT_FALSE(PageHasRoom(1, 400, 601, page, 1000));
  EXPECT_FALSE(PageHasRoom(3, 3, 1, page, 1000));  // page size
}

// Catches: flags that allow a page budget unable to hold one spec-sized job, or nonsense
// values such as --max-jobs 0.
TEST(LimitsTest, ValidateLimits) {
  EXPECT_TRUE(ValidateLimits(Limits()).ok());
  Limits l;
  l.max_jobs = 0;
  EXPECT_NE(ValidateLimits(l).message().find("--max-jobs"), std::string::npos);
  l = Limits();
  l.max_spec_bytes = l.list_page_bytes;
  EXPECT_NE(ValidateLimits(l).message().find("--max-spec-bytes"), std::string::npos);
  l = Limits();
  l.finished_worker_retention = absl::Seconds(-1);  // catches: a negative retention accepted
  EXPECT_EQ(ValidateLimits(l).message(),
            "--finished-worker-retention must be ≥ 0 (or inf), got -1s");
  l.finished_worker_retention = absl::InfiniteDuration();
  EXPECT_TRUE(ValidateLimits(l).ok());
}

}  // namespace
}  // namespace trainstep
