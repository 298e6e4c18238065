// The shipped worker's side of the seam (faults/no_fault_flags.cc): no test hook at all.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "worker/faults/fault_flags.h"

namespace trainstep {
namespace {

int Refuse(std::vector<std::string> args, std::string* message) {
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  const absl::Status s = RefuseTestFlagsUnlessTesting(static_cast<int>(argv.size()), argv.data());
  *message = std::string(s.message());
  return s.ok() ? 0 : 1;
}

// Catches: a --debug-* flag defined in the shipped binary, or hooks that inject something.
TEST(NoFaultFlagsTest, TheShippedWorkerHasNoHookAndInjectsNothing) {
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    EXPECT_FALSE(absl::StartsWith(name, "debug")) << name;
  }
  EXPECT_TRUE(TestFlagGroups().empty());
  absl::StatusOr<TestHooks> hooks = TestHooksFromFlags();
  ASSERT_TRUE(hooks.ok());
  EXPECT_TRUE(hooks->cpuinfo_file.empty());
  EXPECT_FALSE(hooks->faults->ChangesGradientsBeforeAllReduce(1, 0));
  EXPECT_EQ(hooks->faults->AfterMicroSteps(1, 1, 2.5), 2.5);
  EXPECT_EQ(hooks->faults->AfterMicroStep(absl::Seconds(1)), absl::ZeroDuration());
  EXPECT_TRUE(hooks->faults->CheckJob(/*token_level=*/true).ok());
}

// Catches: a harness pointed at the shipped worker getting Abseil's bare "unknown flag" (or
// a hook silently ignored) instead of where the testing build is; an operand after "--" taken
// for a flag.
TEST(NoFaultFlagsTest, AFaultFlagIsRefusedSayingWhereTheTestingBuildIs) {
  std::string message;
  EXPECT_EQ(Refuse({"trainstep-worker", "--job=j", "--debug-slow-factor=3"}, &message), 1);
  EXPECT_EQ(message,
            "--debug-slow-factor: test hooks are flags of the testing build only, "
            "build/bin/testing/trainstep-worker (docs/development.md); this worker is the one "
            "that ships");
  EXPECT_EQ(Refuse({"trainstep-worker", "-debug_hold_file", "/x"}, &message), 1);
  EXPECT_TRUE(absl::StartsWith(message, "-debug_hold_file: ")) << message;
  EXPECT_EQ(Refuse({"trainstep-worker", "--job=j", "--", "--debug-x"}, &message), 0);
}

}  // namespace
}  // namespace trainstep
