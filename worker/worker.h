// Worker: one trainstep-worker process. Registers with the coordinator, loads the job's
// data, and for every generation it is placed in: joins the collective, syncs its replica
// (init, broadcast from a survivor, or a checkpoint), then runs windows and applies
// exactly the coordinator's decisions until the job ends or the generation breaks.
// LibTorch and c10d exceptions stop at this class's edge: they become a job failure with
// their message (ReportFailure) or a rejoin, never a hang.
#ifndef TRAINSTEP_WORKER_WORKER_H_
#define TRAINSTEP_WORKER_WORKER_H_

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/allowed_roots.h"
#include "common/worker_client.h"
#include "worker/checkpoint_writer.h"
#include "worker/collective/collective.h"
#include "worker/cpu_info.h"
#include "worker/data/dataset.h"
#include "worker/data/window_plan.h"
#include "worker/metrics.h"
#include "worker/replica.h"

namespace trainstep {

struct WorkerOptions {
  std::string coordinator;  // host:port
  std::string job_id;       // empty: the oldest job that needs workers
  std::string name;         // for humans (pod name); default host-pid
  // How long registration keeps trying an unreachable coordinator; 0 = forever.
  absl::Duration connect_timeout = absl::Minutes(2);
  CollectiveOptions collective;
  WorkerMetrics* metrics = nullptr;  // may be null
  CpuInfo cpu;                       // this host's CPU, for the bf16 notice
  // Where a job's data, model and checkpoints may be (--allowed-roots); none = anywhere.
  AllowedRoots allowed_roots;
  // Test-only: in this window, this worker perturbs its gradient before reporting (desync).
  int64_t perturb_grad_window = 0;
  // Test-only: this worker exits (code 3) in the evaluation of this update, before reporting.
  int64_t exit_in_eval_update = 0;
};

// How the process should exit.
struct WorkerExit {
  int code = 0;  // 0: the job ended (any state); 1: this worker failed
  std::string message;
};

class Worker {
 public:
  explicit Worker(WorkerOptions options);
  ~Worker();
  WorkerExit Run();

 private:
  // Outcome of running windows in one generation.
  enum class GenerationEnd { kJobDone, kRejoin };

  WorkerExit RunOrThrow();
  absl::Status Setup();
  // Registers (again, after being declared lost: a new identity under the same job) and
  // makes the heartbeats report the dataset to the new identity.
  absl::Status Register();
  std::string WorkerId() const;
  absl::StatusOr<v1::Assignment> AwaitAssignment(int64_t after_generation);
  absl::Status SyncState(const v1::Assignment& a);
  absl::StatusOr<GenerationEnd> RunGeneration(const v1::Assignment& a);
  // One window; returns the decision (ABORT when the generation broke under it).
  absl::StatusOr<v1::WindowDecision> RunWindow(const v1::Assignment& a, int64_t window_id);
  // Held-out evaluation of the replica (at `update_id`) on this rank's share of spec.eval.data,
  // reported to the eval barrier; ABORTED when the generation broke meanwhile.
  absl::Status RunEval(const v1::Assignment& a, int64_t update_id);
  absl::Status WriteCheckpoint(int64_t checkpoint_id, int64_t update_id, int64_t window_id,
                               int64_t scheduler_step, double loss_scale);
  absl::Status AckCheckpoint(const ckpt::CheckpointMeta& meta, const std::string& path);
  absl::Status AwaitJobEnd();
  void HeartbeatLoop();
  // Waits (barriers, the collective's rendezvous) give up once the coordinator's heartbeat
  // answers show the generation this worker joined is no longer the current one.
  void NoteAssignment(const v1::HeartbeatResponse& r);
  bool GenerationSuperseded() const;
  void Fail(const absl::Status& status);

  WorkerOptions options_;
  std::unique_ptr<WorkerClient> client_;
  mutable absl::Mutex mu_;
  std::string worker_id_ ABSL_GUARDED_BY(mu_);  // changes when the worker registers again
  // The identity the current generation's assignment was given to (main thread only): its
  // reports keep using it, so that a worker declared lost meanwhile is refused (NOT_FOUND)
  // and rejoins instead of reporting under an identity that has no rank.
  std::string member_id_;
  std::string job_id_;
  v1::JobSpec spec_;
  absl::Duration heartbeat_every_ = absl::Seconds(1);
  std::optional<data::Dataset> dataset_;
  std::optional<data::Dataset> eval_dataset_;  // set iff spec.eval
  // The latest recorded evaluation (update id, loss), for the checkpoints' meta.json.
  std::optional<std::pair<int64_t, double>> last_eval_;
  std::unique_ptr<data::WindowPlanner> planner_;
  std::unique_ptr<Replica> replica_;
  std::unique_ptr<Collective> collective_;
  std::unique_ptr<CheckpointWriter> checkpoints_;  // rank 0 writes; set by Setup()
  at::Device device_ = at::kCPU;

  std::atomic<int64_t> applied_update_{0};
  std::atomic<bool> job_over_{false};
  // The coordinator refused this worker for good (a different dataset, the job gone).
  std::atomic<bool> refused_{false};
  std::atomic<int64_t> joined_generation_{0};   // the generation this worker last joined
  std::atomic<int64_t> current_generation_{0};  // as the latest heartbeat answer says
  absl::Notification stop_heartbeats_;
  std::thread heartbeats_;
  v1::HeartbeatResponse last_heartbeat_ ABSL_GUARDED_BY(mu_);
  v1::DatasetInfo dataset_report_ ABSL_GUARDED_BY(mu_);  // set once the data is loaded
};

}  // namespace trainstep

#endif  // TRAINSTEP_WORKER_WORKER_H_
