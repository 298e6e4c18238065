// The testing build's fault flags (faults/fault_flags.cc): each is read into the faults it
// names, bad values are refused naming the flag, and --help's group lists flags that exist.
#include "worker/faults/fault_flags.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "core/spec.h"
#include "worker/train/replica.h"

ABSL_DECLARE_FLAG(std::vector<std::string>, debug_nonfinite_grad_windows);
ABSL_DECLARE_FLAG(double, debug_slow_factor);
ABSL_DECLARE_FLAG(std::string, debug_cpuinfo);

namespace trainstep {
namespace {

std::unique_ptr<Replica> MlpReplica() {
  absl::StatusOr<v1::JobSpec> spec =
      ParseAndResolveJobSpec(R"({"model":{"mlp":{}},"data":{"synthetic_regression":{}}})");
  EXPECT_TRUE(spec.ok()) << spec.status();
  std::unique_ptr<Replica> r = *Replica::Create(*spec, at::kCPU);
  r->ZeroGrad();
  return r;
}

// Catches: a flag parsed but not handed to the faults (a harness's fault that never fires), or
// the CPU description flag dropped.
TEST(FaultFlagsTest, FlagsReachTheInjectedFaults) {
  absl::FlagSaver saver;
  absl::SetFlag(&FLAGS_debug_nonfinite_grad_windows, {"3", "8"});
  absl::SetFlag(&FLAGS_debug_cpuinfo, "/tmp/cpuinfo");
  absl::StatusOr<TestHooks> hooks = TestHooksFromFlags();
  ASSERT_TRUE(hooks.ok()) << hooks.status();
  EXPECT_EQ(hooks->cpuinfo_file, "/tmp/cpuinfo");
  EXPECT_TRUE(hooks->faults->ChangesGradientsBeforeAllReduce(3, 0));
  EXPECT_TRUE(hooks->faults->ChangesGradientsBeforeAllReduce(8, 0));
  EXPECT_FALSE(hooks->faults->ChangesGradientsBeforeAllReduce(3, 1));
  std::unique_ptr<Replica> r = MlpReplica();
  hooks->faults->BeforeAllReduce(/*window_id=*/8, /*rank=*/0, /*run=*/2, *r);
  EXPECT_TRUE(r->UnscaleAndNorm(1.0).found_inf);
}

// Catches: a window id of 0 or a word accepted (the fault would never fire), a window given
// twice, or a slow factor that speeds a rank up; each message names the flag.
TEST(FaultFlagsTest, BadValuesAreRefusedNamingTheFlag) {
  const auto error = [] { return std::string(TestHooksFromFlags().status().message()); };
  {
    absl::FlagSaver saver;
    absl::SetFlag(&FLAGS_debug_nonfinite_grad_windows, {"2", "0"});
    EXPECT_EQ(error(), "--debug-nonfinite-grad-windows: item 2 must be a window id ≥ 1, got \"0\"");
    absl::SetFlag(&FLAGS_debug_nonfinite_grad_windows, {"x"});
    EXPECT_EQ(error(), "--debug-nonfinite-grad-windows: item 1 must be a window id ≥ 1, got \"x\"");
    absl::SetFlag(&FLAGS_debug_nonfinite_grad_windows, {"3", "5", "3"});
    EXPECT_EQ(error(), "--debug-nonfinite-grad-windows: window 3 is given twice (items 1 and 3)");
  }
  absl::FlagSaver saver;
  absl::SetFlag(&FLAGS_debug_slow_factor, 0.5);
  EXPECT_EQ(error(), "--debug-slow-factor must be between 1 and 100, got 0.5");
}

// Catches: --help's group naming a flag that does not exist (HelpText would drop it silently)
// or leaving one out; and the testing build refusing its own flags.
TEST(FaultFlagsTest, HelpGroupNamesEveryFaultFlagAndTheyAreTaken) {
  const std::vector<FlagGroup> groups = TestFlagGroups();
  ASSERT_EQ(groups.size(), 1u);
  int debug_flags = 0;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (absl::StartsWith(name, "debug_")) ++debug_flags;
  }
  EXPECT_EQ(static_cast<int>(groups[0].flags.size()), debug_flags);
  for (const std::string& name : groups[0].flags) {
    EXPECT_NE(absl::FindCommandLineFlag(name), nullptr) << name;
  }
  std::vector<std::string> args = {"trainstep-worker", "--debug-slow-factor=2"};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  EXPECT_TRUE(RefuseTestFlagsUnlessTesting(2, argv.data()).ok());
}

}  // namespace
}  // namespace trainstep
