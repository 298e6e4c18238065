// Worker: one trainstep-worker process. Registers with the coordinator, loads the job's
// data, and for every generation it is placed in: joins the collective, syncs its replica
// (init, broadcast from a survivor, or a checkpoint), then runs windows and applies
// exactly the coordinator's decisions until the job ends or the generation breaks.
// LibTorch and c10d exceptions stop at this class's edge: they become a job failure with
// their message (ReportFailure) or a rejoin, never a hang.
#ifndef TRAINSTEP_WORKER_WORKER_H_
#define TRAINSTEP_WORKER_WORKER_H_

#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/allowed_roots.h"
#include "core/window_plan.h"
#include "worker/checkpoint/checkpoint_writer.h"
#include "worker/collective/collective.h"
#include "worker/data/dataset.h"
#include "worker/faults/fault_injector.h"
#include "worker/host/cpu_info.h"
#include "worker/link/coordinator_link.h"
#include "worker/link/worker_client.h"
#include "worker/metrics.h"
#include "worker/train/replica.h"

namespace trainstep {

struct WorkerOptions {
  std::string coordinator;  // host:port
  std::string job_id;       // empty: the oldest job that needs workers
  std::string name;         // for humans (pod name); default host-pid
  // TLS files and bearer token for the coordinator (common/tls.h); default plaintext.
  ChannelSecurity coordinator_security;
  // How long registration keeps trying an unreachable coordinator; 0 = forever.
  absl::Duration connect_timeout = absl::Minutes(2);
  CollectiveOptions collective;
  // Start each gradient bucket's all-reduce inside the window's last backward, as soon as its
  // gradients are final (--overlap-allreduce); false: after backward, as one pass. The same
  // buckets and sums either way. CPU (Gloo) only: a CUDA worker always reduces after backward.
  bool overlap_allreduce = true;
  // Send the next window's BeginWindow (its token count depends on no weights) with this
  // window's CompleteWindow, so that its answer comes with this window's decision: one call
  // per window (--pipeline-begin); false: each window's BeginWindow is sent when the window
  // starts.
  bool pipeline_begin = true;
  WorkerMetrics* metrics = nullptr;  // may be null
  CpuInfo cpu;                       // this host's CPU, for the bf16 notice
  // Where a job's data, model and checkpoints may be (--allowed-roots, {owner} bound for each
  // job; none = anywhere), and the worker's own secrets, which no job may name.
  AllowedRoots allowed_roots;
  // Where faults enter (faults/fault_injector.h): the base class injects none; the testing
  // build passes the ones its flags ask for. Never null.
  std::shared_ptr<const FaultInjector> faults = std::make_shared<const FaultInjector>();
  // The coordinator to talk to (not owned); null: a gRPC client of `coordinator`. Unit tests
  // pass a fake one, and a fake clock for the waits that give up.
  WorkerRpc* client = nullptr;
  const Clock* clock = RealClock::Get();
  // Where the compute thread is (heartbeats, the health service); null: the worker keeps its
  // own.
  ComputePhase* compute_phase = nullptr;
};

// How the process should exit.
struct WorkerExit {
  int code = 0;  // 0: the job ended (any state, by another's hand); 1: this worker failed
  std::string message;
};

class Worker {
 public:
  // Outcome of running windows in one generation.
  enum class GenerationEnd { kJobDone, kRejoin };

  explicit Worker(WorkerOptions options);
  ~Worker();
  WorkerExit Run();

 private:
  WorkerExit RunOrThrow();
  absl::Status Setup();
  absl::Status SyncState(const v1::Assignment& a);
  // `s` is NOT_FOUND for a checkpoint of the directory this job claimed: deleted by hand or
  // pruned by checkpoint.keep_last, as lost as a damaged one. Missing from a directory the job
  // never claimed (a host without the shared file system) stays this worker's failure.
  bool GoneFromOwnDir(const absl::Status& s) const;
  // Joins the generation's collective, syncs the replica, then runs its windows.
  absl::StatusOr<GenerationEnd> JoinAndRun(const v1::Assignment& a);
  absl::StatusOr<GenerationEnd> RunGeneration(const v1::Assignment& a);
  // One window; returns the decision (ABORT when the generation broke under it).
  absl::StatusOr<v1::WindowDecision> RunWindow(const v1::Assignment& a, int64_t window_id);
  // This rank's micro-batches of a window and their valid units (n_r): no weights involved.
  struct WindowPlan {
    std::vector<std::vector<int64_t>> micro_batches;
    int64_t units = 0;
  };
  WindowPlan PlanWindow(const v1::Assignment& a, int64_t window_id) const;
  v1::BeginWindowRequest BeginRequest(const v1::Assignment& a, int64_t window_id,
                                      int64_t units) const;
  // Whether window_id + 1's BeginWindow rides on window_id's CompleteWindow, window_id's begin
  // barrier having answered `b`: not when that window cannot start then anyway (the stop may
  // come after window_id, or an evaluation may be due).
  bool PipelinesAfter(int64_t window_id, const v1::BeginWindowResponse& b) const;
  // A BeginWindow answered ahead: window w+1's report rode on w's CompleteWindow and came back
  // answered with w's decision (pipeline_begin).
  struct NextBegin {
    WindowPlan plan;
    v1::BeginWindowRequest request;
    v1::BeginWindowResponse answer;
    std::string answered_by;  // the coordinator process that answered (heartbeats' view)
  };
  // The answer ahead for `window_id` of `a`, or nothing when none came for it or the previous
  // window's decision was not applied here; one for anything else is dropped.
  std::optional<NextBegin> TakeNextBegin(const v1::Assignment& a, int64_t window_id);
  // This rank's forward/backward passes of a window; returns Σ loss. No collective call, but
  // the last backward passes each gradient to `last_ready` (if any) once it is final.
  absl::StatusOr<double> RunMicroSteps(const v1::Assignment& a,
                                       const std::vector<std::vector<int64_t>>& micro_batches,
                                       int64_t global_units, double loss_scale,
                                       MicroStepTimes* times,
                                       const GradientReadyFn* last_ready = nullptr);
  // One computation of this rank's share of a window (the first, or a re-run the
  // coordinator asked for): micro-steps, the all-reduce, unscale and check.
  struct WindowRun {
    int32_t number = 1;
    double loss_sum = 0.0;
    MicroStepTimes times;
    AllReduceStats reduced;
    double reduce_seconds = 0.0;
    std::optional<double> overlapped_seconds;  // with overlap_allreduce
    UnscaleResult check;
    std::optional<uint64_t> grad_checksum;      // spec.validate: the local gradient's
    std::vector<v1::SampleLoss> sample_losses;  // a re-run's worst samples
  };
  absl::StatusOr<WindowRun> ComputeWindow(const v1::Assignment& a, int64_t window_id,
                                          int32_t run_number,
                                          const std::vector<std::vector<int64_t>>& micro_batches,
                                          const v1::BeginWindowResponse& b);
  // CompleteWindow with `run`'s results (and `next` riding on it): the decision, or a re-run.
  absl::StatusOr<v1::CompleteWindowResponse> ReportWindow(
      const v1::Assignment& a, int64_t window_id, int64_t units,
      const std::vector<std::vector<int64_t>>& micro_batches, const WindowRun& run,
      const std::optional<NextBegin>& next);
  // The loss of each sample of this rank's share (one forward each, no gradient), worst
  // first, at most kReportedSampleLosses: what a reproducible bad window is blamed on.
  static constexpr size_t kReportedSampleLosses = 4;
  absl::StatusOr<std::vector<v1::SampleLoss>> SampleLosses(
      const std::vector<std::vector<int64_t>>& micro_batches);
  // spec.validate is on: windows may be re-run, so each report carries a gradient checksum.
  bool Validates() const;
  // With spec.validate: what makes a re-run reproduce a healthy rank bit for bit (on CUDA,
  // deterministic algorithms and a fixed cuBLAS workspace, or a refusal naming the variable).
  absl::Status PromiseReproducibleWindows();
  // Whether this window's all-reduce starts inside its last backward (overlap_allreduce).
  bool OverlapsAllReduce(int64_t window_id, int32_t rank) const;
  // The coordinator's decision: COMMIT steps the optimizer; SKIP and ABORT keep nothing.
  void ApplyDecision(const v1::WindowDecision& d);
  // Held-out evaluation of the replica (at `update_id`) on this rank's share of spec.eval.data,
  // reported to the eval barrier; ABORTED when the generation broke meanwhile.
  absl::Status RunEval(const v1::Assignment& a, int64_t update_id);
  absl::Status WriteCheckpoint(int64_t checkpoint_id, int64_t update_id, int64_t window_id,
                               int64_t scheduler_step, double loss_scale);
  absl::Status AckCheckpoint(const ckpt::CheckpointMeta& meta, const std::string& path);
  // A checkpoint could not be written (the writing thread): logged, counted, reported to the
  // coordinator (AckCheckpointRequest.error), kept in failed_checkpoint_; training goes on.
  void CheckpointFailed(const ckpt::CheckpointMeta& meta, const absl::Status& why);
  // At the job's end: while its final checkpoint failed and the replica still holds its
  // update, writes it again every kCheckpointRetryEvery until it is durable or the job ended.
  absl::Status WriteFinalCheckpointAgain();
  static constexpr absl::Duration kCheckpointRetryEvery = absl::Seconds(5);
  void Fail(const absl::Status& status);
  // Whether the job is over, by the coordinator's word after an error: a window refused
  // because the job was cancelled ends this worker with the job, not as its failure.
  bool JobOver();
  // While this rank is past the begin barrier of a window (computing, in the all-reduce): if
  // the coordinator restarted meanwhile it forgot that report, and the ranks still waiting at
  // the barrier would wait for ever; the report is sent again, once, on its own thread.
  void ResendBeginIfCoordinatorRestarted();
  void EndBeginResend();  // joins that thread, if any (it ends with the barrier)

  WorkerOptions options_;
  // Shared with the collective's store: a Gloo connect given up when its generation ended
  // finishes on its own thread, and may still call the coordinator after this Worker is gone.
  // Does not own options.client.
  std::shared_ptr<WorkerRpc> shared_client_;
  WorkerRpc* client_ = nullptr;
  // options_.compute_phase, or own_phase_.
  ComputePhase own_phase_;
  ComputePhase* phase_ = nullptr;
  // Registration, the heartbeats and what they say (coordinator_link.h); set by Setup().
  std::unique_ptr<CoordinatorLink> link_;
  std::string job_id_;      // link_'s, once registered
  v1::JobSpec spec_;        // link_'s, once registered
  AllowedRoots job_roots_;  // options_.allowed_roots for the job's owner
  std::optional<data::Dataset> dataset_;
  std::optional<data::Dataset> eval_dataset_;  // set iff spec.eval
  // The latest recorded evaluation (update id, loss), for the checkpoints' meta.json.
  std::optional<std::pair<int64_t, double>> last_eval_;
  std::unique_ptr<WindowPlanner> planner_;
  std::unique_ptr<Replica> replica_;
  std::unique_ptr<Collective> collective_;
  std::unique_ptr<CheckpointWriter> checkpoints_;  // rank 0 writes; set by Setup()
  // The latest checkpoint that could not be written (CheckpointFailed, on the writing thread;
  // read by the training thread after a Flush).
  std::optional<ckpt::CheckpointMeta> failed_checkpoint_;
  at::Device device_ = at::kCPU;

  absl::Mutex begin_mu_;  // the training thread and the collective's keep_waiting callers
  std::optional<v1::BeginWindowRequest> begun_ ABSL_GUARDED_BY(begin_mu_);
  std::string begun_with_ ABSL_GUARDED_BY(begin_mu_);  // the coordinator that answered it
  std::thread begin_resend_ ABSL_GUARDED_BY(begin_mu_);

  // The next window's begin answer, come with this window's decision (pipeline_begin);
  // training thread only. Never outlives its generation: dropped on every way out of
  // RunGeneration.
  std::optional<NextBegin> next_begin_;
  // How long the latest CompleteWindow waited for its decision: the next report's
  // coordinator phase (straggler scores).
  double last_decision_wait_seconds_ = 0.0;
  // The last window whose decision this replica applied, in the generation it runs.
  int64_t applied_window_ = 0;
};

}  // namespace trainstep

#endif  // TRAINSTEP_WORKER_WORKER_H_
