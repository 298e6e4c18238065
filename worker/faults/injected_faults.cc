#include "worker/faults/injected_faults.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "worker/data/collate.h"
#include "worker/train/replica.h"

namespace trainstep {
namespace {

// The first element of the first trainable gradient (parameter order).
at::Tensor FirstGradientElement(Replica& replica) {
  return replica.Gradients().front().view({-1})[0];
}

}  // namespace

absl::Status InjectedFaults::CheckJob(bool token_level) const {
  if (options_.poison_sample >= 0 && token_level) {
    return absl::InvalidArgumentError(
        "--debug-poison-sample needs sample-level data (synthetic_regression)");
  }
  return absl::OkStatus();
}

void InjectedFaults::BeforeWindow(int64_t window_id) const {
  if (options_.hold_file.empty()) return;
  std::error_code ec;
  if (!std::filesystem::exists(options_.hold_file, ec)) return;
  LogInfo(absl::StrCat("--debug-hold-file: holding window ", window_id, " while ",
                       options_.hold_file, " exists"));
  const absl::Time give_up = absl::Now() + kMaxHold;
  while (std::filesystem::exists(options_.hold_file, ec) && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  LogInfo(absl::StrCat("--debug-hold-file: window ", window_id, " goes on"));
}

void InjectedFaults::PoisonSamples(const std::vector<int64_t>& ids, data::MicroBatch& batch) const {
  if (options_.poison_sample < 0 || batch.feature_dim == 0) return;
  for (size_t row = 0; row < ids.size(); ++row) {
    if (ids[row] != options_.poison_sample) continue;
    std::fill_n(batch.features.begin() + static_cast<std::ptrdiff_t>(row * batch.feature_dim),
                batch.feature_dim, std::numeric_limits<float>::quiet_NaN());
  }
}

absl::Duration InjectedFaults::AfterMicroStep(absl::Duration compute) const {
  if (options_.slow_factor <= 1.0) return absl::ZeroDuration();
  const absl::Duration extra = compute * (options_.slow_factor - 1.0);
  absl::SleepFor(extra);
  return extra;
}

double InjectedFaults::AfterMicroSteps(int64_t window_id, int32_t run, double loss_sum) const {
  if (options_.flip_loss_window != window_id || run != 1) return loss_sum;
  LogWarning(
      absl::StrCat("--debug-flip-loss-window: a NaN loss in window ", window_id, " (first run)"));
  return std::numeric_limits<double>::quiet_NaN();
}

bool InjectedFaults::ChangesGradientsBeforeAllReduce(int64_t window_id, int32_t rank) const {
  // A flip file may be armed for any window.
  return options_.flip_grad_window == window_id || !options_.flip_grad_file.empty() ||
         InjectsNonFinite(window_id, rank);
}

void InjectedFaults::BeforeAllReduce(int64_t window_id, int32_t rank, int32_t run,
                                     Replica& replica) const {
  bool flip = options_.flip_grad_window == window_id && run == 1;
  if (!flip && run == 1 && !options_.flip_grad_file.empty()) {
    std::error_code ec;  // armed by a test: consumed by the first window that sees it
    flip = std::filesystem::remove(options_.flip_grad_file, ec);
  }
  if (flip) {
    LogWarning(absl::StrCat("fault injection: +inf into this rank's gradient in window ", window_id,
                            " (first run)"));
  }
  if (flip || InjectsNonFinite(window_id, rank)) {
    FirstGradientElement(replica).fill_(std::numeric_limits<float>::infinity());
  }
}

void InjectedFaults::AfterAllReduce(int64_t window_id, double loss_scale, Replica& replica) const {
  if (options_.perturb_grad_window != window_id) return;
  FirstGradientElement(replica).add_(1e-2 * loss_scale);
}

void InjectedFaults::InEval(int64_t update_id) const {
  if (options_.exit_in_eval_update != update_id) return;
  LogWarning(absl::StrCat("--debug-exit-in-eval: exiting in the evaluation of update ", update_id));
  _exit(3);
}

bool InjectedFaults::InjectsNonFinite(int64_t window_id, int32_t rank) const {
  return rank == 0 &&
         std::find(options_.nonfinite_grad_windows.begin(), options_.nonfinite_grad_windows.end(),
                   window_id) != options_.nonfinite_grad_windows.end();
}

}  // namespace trainstep
