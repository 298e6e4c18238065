// The shipped worker's side of fault_flags.h: no test hook.
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "worker/faults/fault_flags.h"

namespace trainstep {

absl::Status RefuseTestFlagsUnlessTesting(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    if (arg == "--") break;
    if (absl::StartsWith(arg, "--debug") || absl::StartsWith(arg, "-debug")) {
      return absl::InvalidArgumentError(absl::StrCat(
          arg.substr(0, arg.find('=')),
          ": test hooks are flags of the testing build only, build/bin/testing/trainstep-worker "
          "(docs/development.md); this worker is the one that ships"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<TestHooks> TestHooksFromFlags() {
  return TestHooks{std::make_shared<const FaultInjector>(), ""};
}

std::vector<FlagGroup> TestFlagGroups() { return {}; }

}  // namespace trainstep
