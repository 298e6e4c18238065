#include "common/flags.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "common/log.h"

ABSL_FLAG(std::string, test_log_format, "text", "the test's --log-format");
ABSL_FLAG(std::string, test_state_dir, "", "a kebab-case flag");
ABSL_FLAG(int64_t, test_lease_ms, 10000, "a grouped flag");
ABSL_FLAG(bool, test_ungrouped, false, "a flag no group names");
ABSL_FLAG(int64_t, test_library_flag, 0, "a flag of a library, not of main.cc");

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

std::vector<const absl::CommandLineFlag*> Flags(const std::vector<std::string>& names) {
  std::vector<const absl::CommandLineFlag*> flags;
  for (const std::string& n : names) flags.push_back(absl::FindCommandLineFlag(n));
  return flags;
}

// Catches: --help dropping an own flag that no group names, or a flag a group names that the
// binary's main.cc does not define (the testing worker's hooks), or showing snake_case names
// and no defaults.
TEST(FlagsTest, HelpListsEveryOwnFlagAndEveryGroupedFlag) {
  BinaryHelp help;
  help.summary = "prog: does things.";
  help.usage = "  prog [flags]\n";
  help.groups = {{"Leases", {"test_lease_ms", "test_library_flag"}}, {"State", {"test_state_dir"}}};
  help.exit_codes = "  0  done\n";
  help.example = "  prog --test-lease-ms 5\n";
  const std::string text =
      HelpText(help, Flags({"test_lease_ms", "test_state_dir", "test_ungrouped"}));
  EXPECT_EQ(text,
            "prog: does things.\n\n"
            "Usage:\n  prog [flags]\n\n"
            "Leases:\n"
            "  --test-lease-ms N (default: 10000)\n      a grouped flag\n"
            "  --test-library-flag N (default: 0)\n      a flag of a library, not of main.cc\n\n"
            "State:\n"
            "  --test-state-dir VALUE\n      a kebab-case flag\n\n"
            "Other flags:\n"
            "  --test-ungrouped[=true|false] (default: false)\n      a flag no group names\n\n"
            "Flags may be written --like-this or --like_this, with a value after a space or\n"
            "an '=' (booleans: --flag or --flag=false). -h, --help prints this; --helpfull\n"
            "lists every flag, libraries' too.\n\n"
            "Exit codes:\n  0  done\n\nExample:\n  prog --test-lease-ms 5\n");
}

// Catches: -h refused as an unknown flag, --helpfull (Abseil's full dump) taken for ours,
// or a "-h" after "--" (an operand) taken for a request for help.
TEST(FlagsTest, WantsHelpOnlyForHelpBeforeTheOperands) {
  const auto wants = [](std::vector<std::string> args) {
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    return WantsHelp(static_cast<int>(argv.size()), argv.data());
  };
  EXPECT_TRUE(wants({"prog", "-h"}));
  EXPECT_TRUE(wants({"prog", "--listen=x", "--help"}));
  EXPECT_TRUE(wants({"prog", "--helpshort"}));
  EXPECT_FALSE(wants({"prog", "--helpfull"}));
  EXPECT_FALSE(wants({"prog", "--", "-h"}));
  EXPECT_FALSE(wants({"prog", "--hel"}));
}

// Catches: the prologue refusing kebab-case names or not applying the binary's --log-format.
// The only test that parses a command line: Abseil sets the usage message once per process.
TEST(FlagsTest, PrologueParsesAndAppliesTheLogFormat) {
  std::vector<std::string> args = {"flags_test", "--test-log-format", "json",
                                   "--test-state-dir=/x-y"};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  BinaryHelp help;
  help.summary = "usage";
  ASSERT_TRUE(ParseCommandLineAndLogFormat(static_cast<int>(argv.size()), argv.data(), help,
                                           FLAGS_test_log_format)
                  .ok());
  EXPECT_EQ(GetLogFormat(), LogFormat::kJson);
  EXPECT_EQ(absl::GetFlag(FLAGS_test_state_dir), "/x-y");
  SetLogFormat(LogFormat::kText);
}

}  // namespace
}  // namespace trainstep
