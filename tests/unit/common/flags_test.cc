#include "common/flags.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "common/log.h"

ABSL_FLAG(std::string, test_log_format, "text", "the test's --log-format");
ABSL_FLAG(std::string, test_state_dir, "", "a kebab-case flag");

namespace trainstep {
namespace {

// Catches: dashes rewritten in values or after "--", which would change paths and arguments.
TEST(FlagsTest, NormalizesNamesOnly) {
  std::vector<std::string> in = {"prog", "--state-dir=/a-b", "-x-y", "--", "--not-a-flag"};
  std::vector<char*> argv;
  for (std::string& a : in) argv.push_back(a.data());
  std::vector<char*> out;
  const std::vector<std::string> args =
      NormalizeFlagNames(static_cast<int>(argv.size()), argv.data(), &out);
  EXPECT_EQ(args,
            (std::vector<std::string>{"prog", "--state_dir=/a-b", "-x-y", "--", "--not-a-flag"}));
  ASSERT_EQ(out.size(), args.size() + 1);
  EXPECT_EQ(out.back(), nullptr);
}

// Catches: a log format that is applied without being checked.
TEST(FlagsTest, LogFormatIsCheckedBeforeItIsApplied) {
  ASSERT_TRUE(ApplyLogFormatFlag("json").ok());
  EXPECT_EQ(GetLogFormat(), LogFormat::kJson);
  const absl::Status bad = ApplyLogFormatFlag("xml");
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.message(), "--log-format must be text or json, got \"xml\"");
  EXPECT_EQ(GetLogFormat(), LogFormat::kJson);  // unchanged
  ASSERT_TRUE(ApplyLogFormatFlag("text").ok());
  EXPECT_EQ(GetLogFormat(), LogFormat::kText);
}

// Catches: the prologue refusing kebab-case names or not applying the binary's --log-format.
// The only test that parses a command line: Abseil sets the usage message once per process.
TEST(FlagsTest, PrologueParsesAndAppliesTheLogFormat) {
  std::vector<std::string> args = {"flags_test", "--test-log-format", "json",
                                   "--test-state-dir=/x-y"};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  ASSERT_TRUE(ParseCommandLineAndLogFormat(static_cast<int>(argv.size()), argv.data(), "usage",
                                           FLAGS_test_log_format)
                  .ok());
  EXPECT_EQ(GetLogFormat(), LogFormat::kJson);
  EXPECT_EQ(absl::GetFlag(FLAGS_test_state_dir), "/x-y");
  SetLogFormat(LogFormat::kText);
}

}  // namespace
}  // namespace trainstep
