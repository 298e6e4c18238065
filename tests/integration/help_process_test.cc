// `trainstep-coordinator --help` and `trainstep-worker --help` as a user runs them: the
// binaries' own help, every flag they define listed (compared with Abseil's --helpfull), and
// none of the test hooks or build paths of Abseil's raw dump.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdio.h>
#include <sys/wait.h>

#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "tests/integration/process_cluster.h"

namespace trainstep {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

struct BinaryRun {
  int code = -1;
  std::string output;
};

// `binary args` to its end (killed after 30 s), its stdout, and its stderr too when asked.
BinaryRun RunBinary(const std::string& binary, const std::string& args, bool with_stderr) {
  BinaryRun r;
  const std::string command = absl::StrCat("timeout 30 ", binary, " ", args,
                                           with_stderr ? " 2>&1" : " 2>/dev/null", " </dev/null");
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return r;
  char buffer[4096];
  size_t n = 0;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) r.output.append(buffer, n);
  const int status = pclose(pipe);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// The flags Abseil's --helpfull lists under "Flags from …<file>:" (snake_case), e.g. main.cc:
// the binary's own.
std::vector<std::string> FlagsFrom(const std::string& helpfull, absl::string_view file) {
  std::vector<std::string> flags;
  bool in_file = false;
  for (absl::string_view line : absl::StrSplit(helpfull, '\n')) {
    if (absl::StartsWith(line, "  Flags from ")) {
      in_file = absl::EndsWith(line, absl::StrCat(file, ":"));
    }
    if (!in_file || !absl::StartsWith(line, "    --")) continue;
    absl::string_view rest = absl::StripPrefix(line, "    --");
    flags.emplace_back(rest.substr(0, rest.find(' ')));
  }
  return flags;
}

// Whether --help lists --<name> as a flag: followed by its value ("--job VALUE"),
// "[=true|false]" or the line's end.
bool Lists(const std::string& help, const std::string& name) {
  const std::string listed = absl::StrCat("\n  --", absl::StrReplaceAll(name, {{"_", "-"}}));
  return absl::StrContains(help, listed + " ") || absl::StrContains(help, listed + "[") ||
         absl::StrContains(help, listed + "\n");
}

// Catches: --help printing Abseil's dump (build paths, "Flags from", exit 1) instead of the
// binary's own text; -h refused; a defined flag missing from --help or left out of every group
// ("Other flags"); a test hook in a shipped binary (in --helpfull too: not defined at all).
void ExpectHelpListsTheUsersFlags(const std::string& binary) {
  const BinaryRun help = RunBinary(binary, "--help", /*with_stderr=*/false);
  EXPECT_EQ(help.code, 0) << help.output;
  for (const std::string section : {"Usage:\n", "Exit codes:\n", "Environment:\n", "Example:\n"}) {
    EXPECT_THAT(help.output, HasSubstr(section));
  }
  for (const std::string dump : {"--debug", ".cc", "Flags from", "Other flags", "Test hooks"}) {
    EXPECT_THAT(help.output, Not(HasSubstr(dump)));
  }
  const BinaryRun h = RunBinary(binary, "-h", /*with_stderr=*/false);
  EXPECT_EQ(h.code, 0);
  EXPECT_EQ(h.output, help.output);

  const BinaryRun full = RunBinary(binary, "--helpfull", /*with_stderr=*/true);
  EXPECT_THAT(full.output, Not(HasSubstr("--debug")));
  const std::vector<std::string> defined = FlagsFrom(full.output, "main.cc");
  ASSERT_GT(defined.size(), 5u) << full.output;
  for (const std::string& name : defined) EXPECT_TRUE(Lists(help.output, name)) << name;
}

TEST(HelpProcessTest, CoordinatorHelpListsTheUsersFlagsGrouped) {
  ExpectHelpListsTheUsersFlags(testing::BinDir() + "/trainstep-coordinator");
}

TEST(HelpProcessTest, WorkerHelpListsTheUsersFlagsGrouped) {
  const std::string worker = testing::BinDir() + "/trainstep-worker";
  if (!std::filesystem::exists(worker)) {
    GTEST_SKIP() << worker << " is not built (TRAINSTEP_BUILD_WORKER=OFF)";
  }
  ExpectHelpListsTheUsersFlags(worker);
}

// The testing build: the shipped worker's --help plus its test hooks under their own heading,
// and the shipped worker refusing a hook with where to find it.
// Catches: a hook defined but not listed (a harness author cannot find it), or a hook given to
// the shipped worker failing with Abseil's bare "unknown flag" (or being ignored) instead of
// exit 2 naming the testing build.
TEST(HelpProcessTest, TestingWorkerListsItsTestHooksAndTheShippedOneRefusesThem) {
  const std::string testing = testing::BinDir() + "/testing/trainstep-worker";
  if (!std::filesystem::exists(testing)) {
    GTEST_SKIP() << testing << " is not built (TRAINSTEP_BUILD_WORKER=OFF)";
  }
  const BinaryRun help = RunBinary(testing, "--help", /*with_stderr=*/false);
  EXPECT_EQ(help.code, 0) << help.output;
  EXPECT_THAT(help.output,
              HasSubstr("\nTest hooks (this testing build only; docs/development.md):\n"));
  EXPECT_THAT(help.output, Not(HasSubstr("Other flags")));
  const BinaryRun full = RunBinary(testing, "--helpfull", /*with_stderr=*/true);
  const std::vector<std::string> hooks = FlagsFrom(full.output, "fault_flags.cc");
  ASSERT_GE(hooks.size(), 9u) << full.output;
  for (const std::string& name : hooks) {
    EXPECT_TRUE(absl::StartsWith(name, "debug_")) << name;
    EXPECT_TRUE(Lists(help.output, name)) << name;
  }
  for (const std::string& name : FlagsFrom(full.output, "main.cc")) {
    EXPECT_TRUE(Lists(help.output, name)) << name;
  }

  const BinaryRun refused = RunBinary(testing::BinDir() + "/trainstep-worker",
                                      "--debug-slow-factor=2 --host-info", /*with_stderr=*/true);
  EXPECT_EQ(refused.code, 2) << refused.output;
  EXPECT_THAT(refused.output, HasSubstr("--debug-slow-factor: test hooks are flags of the testing "
                                        "build only, build/bin/testing/trainstep-worker"));
}

}  // namespace
}  // namespace trainstep
