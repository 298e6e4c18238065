// A worker without LibTorch: it speaks the real WorkerService protocol over gRPC and
// reports numbers chosen by the test (units, loss, norm, found_inf). Used by the loopback
// tests and the round-trip benchmark.
#ifndef TRAINSTEP_TESTS_INTEGRATION_SIMULATED_WORKER_H_
#define TRAINSTEP_TESTS_INTEGRATION_SIMULATED_WORKER_H_

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "worker/link/worker_client.h"

namespace trainstep::testing {

// What rank `rank` reports for window `window_id`.
struct SimReport {
  int64_t units = 10;
  double loss_sum = 20.0;
  double grad_norm = 1.0;
  bool found_inf = false;
  // Report grad_norm_scaled = grad_norm × the window's loss scale, as a worker with a loss
  // scaler does.
  bool scaled_norm = false;
  // Reported as the window's compute phase (straggler scores); 0 reports no phases.
  double compute_seconds = 0.01;
};
using ReportFn = std::function<SimReport(int64_t window_id, int rank)>;

class SimulatedWorker {
 public:
  SimulatedWorker(const std::string& address, std::string job_id, int64_t dataset_samples,
                  ReportFn report);
  ~SimulatedWorker();

  // Registers, starts heartbeating and reports the dataset.
  absl::Status Register(const std::string& name);
  // Runs windows until the job is done, the worker is stopped, or an error; each
  // decision seen is appended to decisions() by window id.
  absl::Status Run();
  // Each window's CompleteWindow carries the next window's begin report (`next`), as the real
  // worker's --pipeline-begin does: one call per window, the answer taken from the response
  // (and BeginWindow sent on its own only when none came). Off by default. Before Run.
  void set_pipeline_begin(bool on) { pipeline_begin_ = on; }
  // BeginWindow calls made on their own (not riding on a CompleteWindow).
  int64_t plain_begins() const { return plain_begins_; }
  // Simulates a crash: stops heartbeating and stops at the next call.
  void Crash() { crashed_ = true; }
  // Stops the heartbeat thread (used after Run returns).
  void StopHeartbeats();

  std::vector<v1::WindowDecision> decisions() const;
  // Seconds from sending BeginWindow to holding the decision, per decided window.
  std::vector<double> window_seconds() const;
  const std::string& worker_id() const { return worker_id_; }

 private:
  // Waits for an assignment in a generation newer than `after_generation`.
  absl::StatusOr<v1::Assignment> AwaitAssignment(int64_t after_generation);
  void HeartbeatLoop();
  v1::HeartbeatRequest HeartbeatRequest() const;
  v1::BeginWindowRequest BeginRequest(const v1::Assignment& a, int64_t window, int64_t units) const;
  // Rank 0 writes (here: acknowledges) a checkpoint the assignment asks for.
  absl::Status AckPending(const v1::Assignment& a);
  // Reports a held-out loss for `update_id` (spec.eval): 1 / (1 + update_id) over all ranks.
  absl::Status Evaluate(const v1::Assignment& a, int64_t update_id);

  std::string job_id_;
  int64_t dataset_samples_;
  ReportFn report_;
  WorkerClient client_;
  std::string worker_id_;
  absl::Duration heartbeat_every_ = absl::Milliseconds(100);
  std::atomic<int64_t> applied_update_{0};
  std::atomic<bool> crashed_{false};
  bool pipeline_begin_ = false;
  std::atomic<int64_t> plain_begins_{0};
  absl::Notification stop_heartbeats_;
  std::thread heartbeats_;
  mutable absl::Mutex mu_;
  std::vector<v1::WindowDecision> decisions_ ABSL_GUARDED_BY(mu_);
  std::vector<double> window_seconds_ ABSL_GUARDED_BY(mu_);
};

}  // namespace trainstep::testing

#endif  // TRAINSTEP_TESTS_INTEGRATION_SIMULATED_WORKER_H_
