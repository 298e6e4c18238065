// Faults injected into a running worker to test the protocol: spec.debug's non-finite
// gradients, and the --debug-* flags (a desynced replica, an exit during evaluation, a held
// window, a slowed rank). One small interface, called at a few named points, so the window's
// code reads as training and every injection lives here. A worker without faults runs the same
// calls, which do nothing.
#ifndef TRAINSTEP_WORKER_FAULT_HOOKS_H_
#define TRAINSTEP_WORKER_FAULT_HOOKS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "trainstep/v1/spec.pb.h"
#include "worker/data/collate.h"
#include "worker/train/replica.h"

namespace trainstep {

struct FaultOptions {
  // Test-only: in this window, this worker perturbs its gradient before reporting (desync).
  int64_t perturb_grad_window = 0;
  // Test-only: this worker exits (code 3) in the evaluation of this update, before reporting.
  int64_t exit_in_eval_update = 0;
  // Test-only: before each window, this worker waits while this file exists (at most
  // kMaxHold), its heartbeats going on: a test holds training while it arranges a fault.
  std::string hold_file;
  // Test-only: this worker computes this many times slower (a straggler); 1 = not slowed.
  double slow_factor = 1.0;
  // Test-only transient faults, in this window's first run only (a re-run computes it right):
  // +inf into one element of this rank's local gradient before the all-reduce, or a NaN loss.
  int64_t flip_grad_window = 0;
  int64_t flip_loss_window = 0;
  // Test-only, the same flip at a time a test picks: when this file exists at a window's first
  // run, the worker removes it and flips that window's gradient (the chaos tool's grad_flip).
  std::string flip_grad_file;
  // Test-only persistent fault: this sample's features are poisoned (NaN, a corrupt record)
  // whenever this worker collates it, so its loss is non-finite in every run (sample-level
  // data only).
  int64_t poison_sample = -1;
};

class FaultHooks {
 public:
  FaultHooks(const v1::Debug& debug, FaultOptions options) : debug_(debug), options_(options) {}

  // After the window's micro-steps (run `run` of it), before the all-reduce:
  // spec.debug.nonfinite_grad_windows puts +inf into rank 0's gradient (every run), and
  // --debug-flip-grad-window into this rank's (the first run only); every rank sees the
  // overflow after the SUM.
  void BeforeAllReduce(int64_t window_id, int32_t rank, int32_t run, Replica& replica) const;
  // Whether BeforeAllReduce changes a gradient in that window on that rank: such a window
  // all-reduces after backward, not overlapped with it (no bucket may leave before it acts).
  bool ChangesGradientsBeforeAllReduce(int64_t window_id, int32_t rank) const;
  // After the all-reduce, before unscaling (gradients still ×S): --debug-perturb-grad-window
  // nudges only this rank's gradient, so its reported norm differs (a desync). Before the SUM
  // every rank would get the same nudge.
  void AfterAllReduce(int64_t window_id, double loss_scale, Replica& replica) const;
  // The rank's loss of run `run` of a window, as reported: --debug-flip-loss-window makes the
  // first run's NaN (a flipped bit in a reduction), the gradients untouched.
  double AfterMicroSteps(int64_t window_id, int32_t run, double loss_sum) const;
  // A micro-batch of samples `ids`, just collated: --debug-poison-sample overwrites that
  // sample's features with NaN (bad data: the same in every run).
  void PoisonSamples(const std::vector<int64_t>& ids, data::MicroBatch& batch) const;
  // In the evaluation of `update_id`, before reporting it: --debug-exit-in-eval exits (code 3).
  void InEval(int64_t update_id) const;
  // Before window `window_id` starts: --debug-hold-file waits while its file exists. Bounded,
  // so a test that forgets the file slows a job down instead of hanging it; longer than any
  // test waits while holding (120 s for newcomers to start on a loaded machine), so a hold
  // never ends on its own while the test still counts on it.
  static constexpr absl::Duration kMaxHold = absl::Seconds(300);
  void BeforeWindow(int64_t window_id) const;
  // After a micro-step that took `compute`: --debug-slow-factor sleeps (factor - 1) × compute,
  // so the rank's compute takes factor × as long, as on a slow device. Returns the time slept.
  absl::Duration AfterMicroStep(absl::Duration compute) const;

 private:
  // spec.debug.nonfinite_grad_windows names this window, and this is rank 0.
  bool InjectsNonFinite(int64_t window_id, int32_t rank) const;

  v1::Debug debug_;
  FaultOptions options_;
};

}  // namespace trainstep

#endif  // TRAINSTEP_WORKER_FAULT_HOOKS_H_
