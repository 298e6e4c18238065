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

struct Run {
  int code = -1;
  std::string output;
};

// `binary args` to its end (killed after 30 s), its stdout, and its stderr too when asked.
Run RunBinary(const std::string& binary, const std::string& args, bool with_stderr) {
  Run r;
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

struct DefinedFlag {
  std::string name;  // as declared, snake_case
  bool test_only = false;
};

// The flags Abseil's --helpfull lists under "Flags from …main.cc:": the binary's own.
std::vector<DefinedFlag> FlagsOfMain(const std::string& helpfull) {
  std::vector<DefinedFlag> flags;
  bool in_main = false;
  for (absl::string_view line : absl::StrSplit(helpfull, '\n')) {
    if (absl::StartsWith(line, "  Flags from ")) in_main = absl::EndsWith(line, "main.cc:");
    if (!in_main || !absl::StartsWith(line, "    --")) continue;
    absl::string_view rest = absl::StripPrefix(line, "    --");
    const size_t end = rest.find(' ');
    DefinedFlag f;
    f.name = std::string(rest.substr(0, end));
    f.test_only = absl::StartsWith(f.name, "debug_") || absl::StrContains(line, "(TEST ONLY");
    flags.push_back(f);
  }
  return flags;
}

// Catches: --help printing Abseil's dump (build paths, "Flags from", TEST ONLY hooks, exit 1)
// instead of the binary's own text; -h refused; a defined flag missing from --help or left out
// of every group ("Other flags"); a test hook listed.
void ExpectHelpListsTheUsersFlags(const std::string& binary) {
  const Run help = RunBinary(binary, "--help", /*with_stderr=*/false);
  EXPECT_EQ(help.code, 0) << help.output;
  for (const std::string section : {"Usage:\n", "Exit codes:\n", "Environment:\n", "Example:\n"}) {
    EXPECT_THAT(help.output, HasSubstr(section));
  }
  for (const std::string dump : {"TEST ONLY", "--debug", ".cc", "Flags from", "Other flags"}) {
    EXPECT_THAT(help.output, Not(HasSubstr(dump)));
  }
  const Run h = RunBinary(binary, "-h", /*with_stderr=*/false);
  EXPECT_EQ(h.code, 0);
  EXPECT_EQ(h.output, help.output);

  const Run full = RunBinary(binary, "--helpfull", /*with_stderr=*/true);
  const std::vector<DefinedFlag> defined = FlagsOfMain(full.output);
  ASSERT_GT(defined.size(), 5u) << full.output;
  for (const DefinedFlag& f : defined) {
    const std::string listed = absl::StrCat("\n  --", absl::StrReplaceAll(f.name, {{"_", "-"}}));
    // Followed by its value ("--job VALUE"), "[=true|false]" or the line's end.
    const bool shown = absl::StrContains(help.output, listed + " ") ||
                       absl::StrContains(help.output, listed + "[") ||
                       absl::StrContains(help.output, listed + "\n");
    EXPECT_EQ(shown, !f.test_only) << f.name << (f.test_only ? " is a test hook" : "") << "\n"
                                   << help.output;
  }
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

}  // namespace
}  // namespace trainstep
