// The testing build's side of fault_flags.h: the --debug-* flags, read into InjectedFaults.
#include "worker/faults/fault_flags.h"

#include <map>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/faults/injected_faults.h"

ABSL_FLAG(std::vector<std::string>, debug_nonfinite_grad_windows, {},
          "W[,W…]: in these windows, if this worker is rank 0, +inf into one element of its "
          "gradient after the last backward and before the all-reduce, in every run (an fp16 "
          "overflow every rank sees after the SUM: with a loss scaler the window is skipped as "
          "OVERFLOW). Give every worker the same list: whichever is rank 0 acts");
ABSL_FLAG(int64_t, debug_perturb_grad_window, 0,
          "in that window, nudge this worker's gradient after the all-reduce, so its reported "
          "norm differs from its peers' (replicas desync: the window is aborted as DESYNC)");
ABSL_FLAG(int64_t, debug_exit_in_eval, 0,
          "exit (code 3) during the evaluation of that update, after computing the held-out "
          "loss and before reporting it: a rank lost during an evaluation");
ABSL_FLAG(std::string, debug_hold_file, "",
          "before each window, wait while this file exists (at most 300 s; heartbeats go on): "
          "a harness holds training while it arranges a fault");
ABSL_FLAG(double, debug_slow_factor, 1.0,
          "this worker computes this many times slower (it sleeps after each micro-step for "
          "(factor - 1) times the micro-step's time): a straggler; 1 = not slowed, at most 100");
ABSL_FLAG(int64_t, debug_flip_grad_window, 0,
          "in that window's first run, +inf into one element of this worker's local gradient "
          "before the all-reduce (a transient fault; spec.validate re-runs the window)");
ABSL_FLAG(std::string, debug_flip_grad_file, "",
          "when this file exists at a window's first run, remove it and flip that window's "
          "gradient as --debug-flip-grad-window does (a fault at a time a harness picks)");
ABSL_FLAG(int64_t, debug_flip_loss_window, 0,
          "in that window's first run, report a NaN loss (a transient fault)");
ABSL_FLAG(int64_t, debug_poison_sample, -1,
          "overwrite that sample's features with NaN whenever this worker reads it (a corrupt "
          "record: a persistent fault; synthetic_regression data only)");
ABSL_FLAG(std::string, debug_cpuinfo, "",
          "read the CPU's description from this file instead of /proc/cpuinfo (e.g. a CPU "
          "without native bf16, for the precision the demo picks)");

namespace trainstep {
namespace {

// --debug-nonfinite-grad-windows: each a window id ≥ 1, none twice.
absl::StatusOr<std::vector<int64_t>> NonfiniteWindows() {
  std::vector<int64_t> windows;
  std::map<int64_t, size_t> seen;
  const std::vector<std::string> items = absl::GetFlag(FLAGS_debug_nonfinite_grad_windows);
  for (size_t i = 0; i < items.size(); ++i) {
    int64_t w = 0;
    if (!absl::SimpleAtoi(items[i], &w) || w < 1) {
      return absl::InvalidArgumentError(absl::StrCat("--debug-nonfinite-grad-windows: item ", i + 1,
                                                     " must be a window id ≥ 1, got \"", items[i],
                                                     "\""));
    }
    if (auto [it, inserted] = seen.emplace(w, i); !inserted) {
      return absl::InvalidArgumentError(absl::StrCat("--debug-nonfinite-grad-windows: window ", w,
                                                     " is given twice (items ", it->second + 1,
                                                     " and ", i + 1, ")"));
    }
    windows.push_back(w);
  }
  return windows;
}

}  // namespace

absl::Status RefuseTestFlagsUnlessTesting(int argc, char** argv) { return absl::OkStatus(); }

absl::StatusOr<TestHooks> TestHooksFromFlags() {
  FaultOptions f;
  ASSIGN_OR_RETURN(f.nonfinite_grad_windows, NonfiniteWindows());
  f.perturb_grad_window = absl::GetFlag(FLAGS_debug_perturb_grad_window);
  f.exit_in_eval_update = absl::GetFlag(FLAGS_debug_exit_in_eval);
  f.hold_file = absl::GetFlag(FLAGS_debug_hold_file);
  f.slow_factor = absl::GetFlag(FLAGS_debug_slow_factor);
  if (!(f.slow_factor >= 1.0 && f.slow_factor <= 100.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--debug-slow-factor must be between 1 and 100, got ", f.slow_factor));
  }
  f.flip_grad_window = absl::GetFlag(FLAGS_debug_flip_grad_window);
  f.flip_loss_window = absl::GetFlag(FLAGS_debug_flip_loss_window);
  f.flip_grad_file = absl::GetFlag(FLAGS_debug_flip_grad_file);
  f.poison_sample = absl::GetFlag(FLAGS_debug_poison_sample);
  return TestHooks{std::make_shared<const InjectedFaults>(std::move(f)),
                   absl::GetFlag(FLAGS_debug_cpuinfo)};
}

std::vector<FlagGroup> TestFlagGroups() {
  return {{"Test hooks (this testing build only; docs/development.md)",
           {"debug_nonfinite_grad_windows", "debug_flip_grad_window", "debug_flip_grad_file",
            "debug_flip_loss_window", "debug_perturb_grad_window", "debug_poison_sample",
            "debug_slow_factor", "debug_hold_file", "debug_exit_in_eval", "debug_cpuinfo"}}};
}

}  // namespace trainstep
