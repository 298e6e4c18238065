// The seam through which faults enter a running worker, called at a few named points of a
// window so that the window's code reads as training (as LevelDB's Env is the seam for files).
// This class injects nothing: it is what the shipped trainstep-worker runs. The testing build
// (build/bin/testing/trainstep-worker) runs InjectedFaults, configured by its fault flags;
// docs/development.md says how a harness uses each one.
#ifndef TRAINSTEP_WORKER_FAULTS_FAULT_INJECTOR_H_
#define TRAINSTEP_WORKER_FAULTS_FAULT_INJECTOR_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace trainstep {

class Replica;
namespace data {
struct MicroBatch;
}  // namespace data

class FaultInjector {
 public:
  virtual ~FaultInjector() = default;

  // Once the job is known: an error when a fault cannot act on this job (e.g. a poisoned
  // sample in token-level data); the worker then fails instead of running without it.
  virtual absl::Status CheckJob(bool token_level) const { return absl::OkStatus(); }
  // Before window `window_id` starts (heartbeats go on meanwhile).
  virtual void BeforeWindow(int64_t window_id) const {}
  // A micro-batch of samples `ids`, just collated.
  virtual void PoisonSamples(const std::vector<int64_t>& ids, data::MicroBatch& batch) const {}
  // After a micro-step that took `compute`; returns the extra time it spent.
  virtual absl::Duration AfterMicroStep(absl::Duration compute) const {
    return absl::ZeroDuration();
  }
  // The rank's loss sum of run `run` of a window, as it will be reported.
  virtual double AfterMicroSteps(int64_t window_id, int32_t run, double loss_sum) const {
    return loss_sum;
  }
  // Whether BeforeAllReduce changes a gradient in that window on that rank: such a window
  // all-reduces after backward, not overlapped with it (no bucket may leave before it acts).
  virtual bool ChangesGradientsBeforeAllReduce(int64_t window_id, int32_t rank) const {
    return false;
  }
  // After the window's micro-steps (run `run` of it), before the all-reduce.
  virtual void BeforeAllReduce(int64_t window_id, int32_t rank, int32_t run,
                               Replica& replica) const {}
  // After the all-reduce, before unscaling (gradients still ×loss_scale), first run only.
  virtual void AfterAllReduce(int64_t window_id, double loss_scale, Replica& replica) const {}
  // In the evaluation of `update_id`, before it is reported.
  virtual void InEval(int64_t update_id) const {}
};

}  // namespace trainstep

#endif  // TRAINSTEP_WORKER_FAULTS_FAULT_INJECTOR_H_
