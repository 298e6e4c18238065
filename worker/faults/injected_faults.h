// The faults the testing build's flags ask for (fault_flags.cc), injected through the
// FaultInjector seam: non-finite and desynced gradients, NaN losses, poisoned samples, a slowed
// rank, a held window, an exit during evaluation. Each acts exactly where and when it is
// asked to, and nowhere else: a fault that fired on every rank or in every window would turn
// the protocol tests that use it (overflow skips, desync aborts, re-runs) into tests of
// something else.
#ifndef TRAINSTEP_WORKER_FAULTS_INJECTED_FAULTS_H_
#define TRAINSTEP_WORKER_FAULTS_INJECTED_FAULTS_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "worker/faults/fault_injector.h"

namespace trainstep {

struct FaultOptions {
  // In these windows, if this worker is rank 0, +inf into one element of its gradient after
  // the last backward and before the all-reduce, in every run: an fp16 overflow that every
  // rank sees after the SUM.
  std::vector<int64_t> nonfinite_grad_windows;
  // In this window, this worker perturbs its gradient after the all-reduce (a desync).
  int64_t perturb_grad_window = 0;
  // This worker exits (code 3) in the evaluation of this update, before reporting it.
  int64_t exit_in_eval_update = 0;
  // Before each window, this worker waits while this file exists (at most kMaxHold), its
  // heartbeats going on: a test holds training while it arranges a fault.
  std::string hold_file;
  // This worker computes this many times slower (a straggler); 1 = not slowed.
  double slow_factor = 1.0;
  // Transient faults, in this window's first run only (a re-run computes it right): +inf into
  // one element of this rank's local gradient before the all-reduce, or a NaN loss.
  int64_t flip_grad_window = 0;
  int64_t flip_loss_window = 0;
  // The same gradient flip at a time a test picks: when this file exists at a window's first
  // run, the worker removes it and flips that window's gradient (the chaos tool's grad_flip).
  std::string flip_grad_file;
  // A persistent fault: this sample's features are poisoned (NaN, a corrupt record) whenever
  // this worker collates it, so its loss is non-finite in every run (sample-level data only).
  int64_t poison_sample = -1;
};

class InjectedFaults : public FaultInjector {
 public:
  explicit InjectedFaults(FaultOptions options) : options_(std::move(options)) {}

  // A poisoned sample needs sample-level data.
  absl::Status CheckJob(bool token_level) const override;
  // Waits while the hold file exists. Bounded, so a test that forgets the file slows a job
  // down instead of hanging it; longer than any test waits while holding (120 s for newcomers
  // to start on a loaded machine), so a hold never ends on its own while a test counts on it.
  static constexpr absl::Duration kMaxHold = absl::Seconds(300);
  void BeforeWindow(int64_t window_id) const override;
  // Overwrites the poisoned sample's features with NaN (bad data: the same in every run).
  void PoisonSamples(const std::vector<int64_t>& ids, data::MicroBatch& batch) const override;
  // Sleeps (factor - 1) × compute, so the rank's compute takes factor × as long, as on a slow
  // device. Returns the time slept.
  absl::Duration AfterMicroStep(absl::Duration compute) const override;
  // The first run's loss is NaN in the flip-loss window (a flipped bit in a reduction), the
  // gradients untouched.
  double AfterMicroSteps(int64_t window_id, int32_t run, double loss_sum) const override;
  bool ChangesGradientsBeforeAllReduce(int64_t window_id, int32_t rank) const override;
  // Non-finite windows: +inf into rank 0's gradient (every run); the flip window or file:
  // into this rank's (first run only). Every rank sees the overflow after the SUM.
  void BeforeAllReduce(int64_t window_id, int32_t rank, int32_t run,
                       Replica& replica) const override;
  // Nudges only this rank's gradient, so its reported norm differs (a desync). Before the SUM
  // every rank would get the same nudge.
  void AfterAllReduce(int64_t window_id, double loss_scale, Replica& replica) const override;
  // Exits (code 3) in the evaluation of the chosen update.
  void InEval(int64_t update_id) const override;

 private:
  // A non-finite window names this window, and this is rank 0.
  bool InjectsNonFinite(int64_t window_id, int32_t rank) const;

  FaultOptions options_;
};

}  // namespace trainstep

#endif  // TRAINSTEP_WORKER_FAULTS_INJECTED_FAULTS_H_
