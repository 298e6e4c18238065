// A job to observe: the real trainstep-coordinator binary on 127.0.0.1 (free ports from
// --port-file, metrics on, stderr in DIR/coordinator.log), driven by simulated workers on
// threads. Each simulated worker also serves a worker /metrics endpoint (the real
// WorkerMetrics class, fed with what that worker "ran"), so both kinds of endpoint can be
// scraped without LibTorch. The numbers the workers report are chosen so that a run has
// commits, clipped norms, overflow and empty-window skips, a loss scale that moves, and
// checkpoints.
#ifndef TRAINSTEP_TESTS_OBSERVABILITY_OBSERVED_JOB_H_
#define TRAINSTEP_TESTS_OBSERVABILITY_OBSERVED_JOB_H_

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "tests/integration/simulated_worker.h"
#include "tests/observability/observability_util.h"
#include "trainstep/v1/job_service.grpc.pb.h"
#include "worker/metrics.h"

namespace trainstep::obs {

struct ObservedJobOptions {
  std::string log_format = "text";  // the coordinator's --log-format
  int workers = 2;
  int64_t windows = 40;  // one epoch of this many windows
  // > 0: every worker waits before reporting this window until Resume(), so the job can be
  // observed while RUNNING.
  int64_t pause_at_window = 0;
};

class ObservedJob {
 public:
  // Starts the coordinator with its state, logs and port file under `dir` (emptied first).
  static absl::StatusOr<std::unique_ptr<ObservedJob>> Start(const std::string& dir,
                                                            ObservedJobOptions options = {});
  ~ObservedJob();

  // Submits the job and starts the workers (registration, then Run on their threads).
  absl::Status SubmitAndRun();
  // True once every worker waits at options.pause_at_window.
  bool WaitUntilPaused(absl::Duration timeout);
  void Resume();
  // Waits for the workers to finish and the job to end; returns the job.
  absl::StatusOr<v1::Job> WaitForEnd(absl::Duration timeout);
  absl::StatusOr<v1::Job> GetJob();
  absl::StatusOr<std::vector<v1::UpdateRecord>> Updates();

  const std::string& dir() const { return dir_; }
  const std::string& job_id() const { return job_id_; }
  const std::string& address() const { return address_; }
  int coordinator_metrics_port() const { return metrics_port_; }
  std::vector<int> worker_metrics_ports() const;
  ChildProcess& coordinator() { return *coordinator_; }
  // The spec submitted (JSON).
  std::string spec() const;
  // The coordinator's log tail, for failure messages.
  std::string Logs() const { return coordinator_->LogTail(); }

 private:
  ObservedJob() = default;
  ::trainstep::testing::SimReport Report(int worker, int64_t window, int rank);

  ObservedJobOptions options_;
  std::string dir_;
  std::string address_;
  std::string job_id_;
  int metrics_port_ = 0;
  std::unique_ptr<ChildProcess> coordinator_;
  std::unique_ptr<v1::JobService::Stub> jobs_;
  std::vector<std::unique_ptr<WorkerMetrics>> worker_metrics_;
  std::vector<std::unique_ptr<::trainstep::testing::SimulatedWorker>> workers_;
  std::vector<std::thread> threads_;
  absl::Mutex mu_;
  std::vector<absl::Status> results_ ABSL_GUARDED_BY(mu_);
  std::atomic<int> paused_{0};
  absl::Notification resume_;
};

}  // namespace trainstep::obs

#endif  // TRAINSTEP_TESTS_OBSERVABILITY_OBSERVED_JOB_H_
