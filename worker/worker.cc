#include "worker/worker.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/address.h"
#include "common/clock.h"
#include "common/env.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "core/spec.h"
#include "worker/checkpoint/checkpoint_dir.h"
#include "worker/data/collate.h"
#include "worker/host/bf16_probe.h"
#include "worker/link/coordinator_link.h"
#include "worker/models/llama.h"
#include "worker/train/device.h"
#include "worker/train/generate.h"
#include "worker/train/loss.h"
#include "worker/train/torch_status.h"

namespace trainstep {
namespace {

// A report refused as stale (ABORTED) means the window was aborted under this rank: the
// same outcome as an ABORT decision. Other errors stay errors.
absl::StatusOr<v1::WindowDecision> AbortedOrError(const absl::Status& s) {
  if (s.code() != absl::StatusCode::kAborted) return s;
  v1::WindowDecision d;
  d.set_outcome(v1::ABORT);
  d.set_reason(std::string(s.message()));
  return d;
}

// What a failed step means for the generation (Classify): a rejoin, logged with `what`, or
// the error itself, which fails the job.
absl::StatusOr<Worker::GenerationEnd> RejoinOrFail(const absl::Status& s, const std::string& what) {
  if (Classify(s) == ErrorMeaning::kRejoin) {
    LogWarning(absl::StrCat(what, ": ", s.message(), "; rejoining"));
    return Worker::GenerationEnd::kRejoin;
  }
  return s;
}

// An error of this process's own files or LibTorch is its own failure whatever its code: a
// checkpoint file NOT_FOUND must not read as this worker declared lost (Classify).
absl::Status OwnFailure(const absl::Status& s) {
  if (s.ok() || Classify(s) == ErrorMeaning::kFatal) return s;
  return absl::InternalError(s.message());
}

// What the log says when the job ends (`last`: the coordinator's word on it). Every ended job
// exits 0: a job cancelled, or failed by another rank, is no failure of this worker, and a
// restart would only be refused (Kubernetes must neither restart it nor alert).
std::string JobEndMessage(const std::string& job_id, const HeartbeatSnapshot& last) {
  const std::string why = last.job_message.empty() ? "" : absl::StrCat(": ", last.job_message);
  switch (last.job_state) {
    case v1::CANCELLED:
      return absl::StrCat("job ", job_id, " was cancelled", why);
    case v1::FAILED:  // by another rank's error (this one's own returns before)
      return absl::StrCat("job ", job_id, " failed", why);
    default:
      return absl::StrCat("job ", job_id, " ended: ", v1::JobState_Name(last.job_state), why);
  }
}

}  // namespace

Worker::Worker(WorkerOptions options)
    : options_(std::move(options)),
      own_phase_(options_.clock),
      phase_(options_.compute_phase != nullptr ? options_.compute_phase : &own_phase_) {
  if (options_.name.empty()) {
    options_.name = absl::StrCat(LocalHostName(), "-", getpid());
  }
}

Worker::~Worker() = default;

void Worker::Fail(const absl::Status& status) {
  if (link_ == nullptr) {
    LogError(status.ToString());
    return;
  }
  link_->ReportFailure(status);
}

absl::Status Worker::Setup() {
  WorkerClientOptions copts;
  // Re-sent every 2 s, so a wait notices within a heartbeat that its generation is gone.
  copts.barrier_poll = absl::Seconds(2);
  copts.keep_waiting = [this] { return link_ == nullptr || link_->KeepWaiting(); };
  copts.connect_timeout = options_.connect_timeout;
  // Every failed attempt to reach the coordinator is logged: the first, then every 10 s.
  copts.on_connect_retry = [this, next_log = absl::InfinitePast()](const absl::Status& s) mutable {
    const absl::Time now = absl::Now();
    if (now < next_log) return;
    next_log = now + absl::Seconds(10);
    const std::string security =
        ExplainSecurityFailure(s, options_.coordinator_security, options_.coordinator);
    LogWarning(absl::StrCat(
        "cannot reach the coordinator at ", options_.coordinator, " yet (",
        absl::StatusCodeToString(s.code()), ": ", s.message(), ")",
        security.empty() ? "" : absl::StrCat(": ", security), "; retrying",
        options_.connect_timeout > absl::ZeroDuration()
            ? absl::StrCat(" for up to ", absl::FormatDuration(options_.connect_timeout),
                           " (--connect-timeout)")
            : " until it answers (--connect-timeout 0)"));
  };
  if (options_.client != nullptr) {
    shared_client_ = std::shared_ptr<WorkerRpc>(options_.client, [](WorkerRpc*) {});
  } else {
    shared_client_ = std::make_shared<WorkerClient>(
        MakeChannel(options_.coordinator, options_.coordinator_security), copts);
  }
  client_ = shared_client_.get();
  LinkOptions lopts;
  lopts.job_id = options_.job_id;
  lopts.name = options_.name;
  lopts.host = options_.collective.host;
  lopts.coordinator = options_.coordinator;
  lopts.clock = options_.clock;
  lopts.compute_phase = phase_;
  link_ = std::make_unique<CoordinatorLink>(client_, lopts);
  RETURN_IF_ERROR(link_->Register());
  // A collective blocked on a peer that died or stopped ends once the coordinator says the
  // generation is over (the Attach stream brings that at once), not at the collective timeout.
  options_.collective.keep_waiting = [this] {
    ResendBeginIfCoordinatorRestarted();
    return link_->KeepWaiting();
  };
  job_id_ = link_->job_id();
  spec_ = link_->spec();
  // Before anything reads or writes a path of the spec: it comes from whoever submitted it.
  absl::StatusOr<AllowedRoots> roots = options_.allowed_roots.ForOwner(link_->owner());
  absl::Status paths = roots.ok() ? CheckSpecPaths(spec_, *roots) : roots.status();
  if (!paths.ok()) {
    Fail(paths);
    return paths;
  }
  job_roots_ = std::move(*roots);
  if (options_.metrics != nullptr) options_.metrics->SetJob(job_id_);
  device_ = options_.collective.device;
  UseDeviceInThisThread(device_);
  if (spec_.precision() == v1::JobSpec::bf16 && !device_.is_cuda()) LogBf16Notice(options_.cpu);
  if (absl::Status s = PromiseReproducibleWindows(); !s.ok()) {
    Fail(s);
    return s;
  }

  // Heartbeats start before the (possibly long) model and data loads, so the lease holds
  // meanwhile.
  link_->StartHeartbeats();

  absl::StatusOr<std::unique_ptr<Replica>> replica = Replica::Create(spec_, device_, job_roots_);
  if (!replica.ok()) {
    Fail(replica.status());
    return replica.status();
  }
  replica_ = std::move(*replica);
  // The model's own vocabulary from here on: the data's ids are checked against it before any
  // window, and the spec written beside the checkpoints carries it.
  RecordModelVocabulary(replica_->model(), spec_);
  checkpoints_ = std::make_unique<CheckpointWriter>(
      spec_.checkpoint().dir(), spec_.checkpoint().keep_last(), replica_->model().CheckpointFiles(),
      [this](const ckpt::CheckpointMeta& meta, const std::string& path) {
        return AckCheckpoint(meta, path);
      });
  checkpoints_->set_on_failed([this](const ckpt::CheckpointMeta& meta, const absl::Status& why) {
    CheckpointFailed(meta, why);
  });

  absl::StatusOr<data::Dataset> d = data::Dataset::Load(spec_, job_roots_);
  if (!d.ok()) {
    Fail(d.status());
    return d.status();
  }
  dataset_ = std::move(*d);
  if (spec_.has_eval()) {
    // The held-out data loads as the training data does, with its own field path in errors.
    v1::JobSpec eval_spec = spec_;
    *eval_spec.mutable_data() = spec_.eval().data();
    absl::StatusOr<data::Dataset> e = data::Dataset::Load(eval_spec, job_roots_);
    if (!e.ok()) {
      const absl::string_view m = e.status().message();
      const absl::Status s(e.status().code(), absl::StartsWith(m, "data.")
                                                  ? absl::StrCat("eval.", m)
                                                  : absl::StrCat("eval.data: ", m));
      Fail(s);
      return s;
    }
    eval_dataset_ = std::move(*e);
  }
  planner_ = std::make_unique<WindowPlanner>(spec_, dataset_->size());
  v1::DatasetInfo dataset;
  dataset.set_samples(dataset_->size());
  dataset.set_fingerprint(dataset_->fingerprint());
  if (const LlamaConfig* config = LlamaConfigOf(replica_->model()); config != nullptr) {
    *dataset.mutable_model_config() = LlamaConfigStruct(*config);
  }
  link_->SetDataset(dataset);  // the heartbeats report it from here on
  if (options_.overlap_allreduce && device_.is_cuda()) {
    // NCCL would be launched from autograd's device threads, on their streams: not done here.
    LogInfo(
        "on CUDA the gradient all-reduce runs after backward (--overlap-allreduce is for "
        "CPU workers)");
  } else if (options_.overlap_allreduce && !replica_->gradient_hooks()) {
    LogWarning(absl::StrCat("the gradient all-reduce cannot overlap backward (",
                            replica_->gradient_hooks_missing(), "): it runs after backward"));
  }
  LogInfo(absl::StrCat(dataset_->size(), " samples (fingerprint ", dataset_->fingerprint(), "), ",
                       planner_->windows_per_epoch(), " windows per epoch"));
  return absl::OkStatus();
}

absl::Status Worker::PromiseReproducibleWindows() {
  RETURN_IF_ERROR(options_.faults->CheckJob(IsTokenLevel(spec_)));
  if (!Validates()) return absl::OkStatus();
  // On CPU a window's kernels, threads and reduction order are those of its first run (the
  // built-in models draw no random numbers). On CUDA cuBLAS and some kernels pick algorithms
  // that are not deterministic unless told.
  if (!device_.is_cuda()) return absl::OkStatus();
  const char* workspace = std::getenv("CUBLAS_WORKSPACE_CONFIG");
  const std::string ws = workspace == nullptr ? "" : workspace;
  if (ws != ":4096:8" && ws != ":16:8") {
    return absl::FailedPreconditionError(absl::StrCat(
        "spec.validate needs windows that reproduce bit for bit, and on CUDA cuBLAS does that "
        "only with a fixed workspace: start the worker with CUBLAS_WORKSPACE_CONFIG=:4096:8 "
        "(or :16:8), got ",
        ws.empty() ? "none" : ws));
  }
  at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/false);
  at::globalContext().setDeterministicCuDNN(true);
  at::globalContext().setBenchmarkCuDNN(false);
  LogInfo("spec.validate: deterministic CUDA algorithms on, so a re-run reproduces a window");
  return absl::OkStatus();
}

bool Worker::GoneFromOwnDir(const absl::Status& s) const {
  if (!absl::IsNotFound(s)) return false;
  absl::StatusOr<std::string> owner =
      Env::Default()->ReadFile(absl::StrCat(spec_.checkpoint().dir(), "/", ckpt::kClaimFile));
  return owner.ok() && absl::StripTrailingAsciiWhitespace(*owner) == job_id_;
}

absl::Status Worker::SyncState(const v1::Assignment& a) {
  switch (a.state_source()) {
    case v1::Assignment::CHECKPOINT: {
      absl::StatusOr<ckpt::LoadedCheckpoint> c =
          ckpt::ReadCheckpoint(spec_.checkpoint().dir(), a.checkpoint_id());
      if (absl::IsDataLoss(c.status()) || GoneFromOwnDir(c.status())) {
        // Damaged after it was written: not this worker's failure, nor the job's. The job
        // rolls back past it, and this worker waits for that generation.
        const absl::Status told = link_->ReportDamagedCheckpoint(a.checkpoint_id(), c.status());
        return absl::AbortedError(
            absl::StrCat("checkpoint ", a.checkpoint_id(), " is damaged",
                         told.ok() ? "" : absl::StrCat("; the coordinator: ", told.message())));
      }
      if (!c.ok()) return OwnFailure(c.status());
      RETURN_IF_ERROR(OwnFailure(replica_->Restore(c->model, c->optimizer)));
      LogInfo(absl::StrCat("restored checkpoint ", a.checkpoint_id(), " (update ",
                           c->meta.optimizer_update_id, ") from ", c->path));
      break;
    }
    case v1::Assignment::INIT: {
      // A rolled-back job restarts from fresh weights; a fresh job already has them.
      if (link_->applied_update() != 0 || a.optimizer_update_id() != 0) {
        ASSIGN_OR_RETURN(replica_, Replica::Create(spec_, device_, job_roots_));
      }
      [[fallthrough]];
    }
    case v1::Assignment::BROADCAST: {
      // Every rank takes the source's model and optimizer state (DDP does the same at start).
      if (a.world_size() > 1) {
        const int src = a.state_source() == v1::Assignment::BROADCAST ? a.source_rank() : 0;
        std::string bytes;
        if (a.rank() == src) {
          ASSIGN_OR_RETURN(bytes, replica_->SerializeState());
        }
        RETURN_IF_ERROR(collective_->BroadcastBytes(&bytes, src));
        if (a.rank() != src) RETURN_IF_ERROR(replica_->LoadState(bytes));
      }
      break;
    }
    default:
      return absl::InvalidArgumentError("assignment without a state source");
  }
  replica_->ZeroGrad();
  link_->SetAppliedUpdate(a.optimizer_update_id());
  return absl::OkStatus();
}

absl::Status Worker::WriteCheckpoint(int64_t checkpoint_id, int64_t update_id, int64_t window_id,
                                     int64_t scheduler_step, double loss_scale) {
  // Claimed before anything is written there: the directory may hold another job's files.
  RETURN_IF_ERROR(ckpt::ClaimCheckpointDir(spec_.checkpoint().dir(), job_id_));
  // The resolved spec beside the checkpoints makes them self-describing (--generate, resume).
  const std::string spec_path = SpecPathFor(spec_.checkpoint().dir());
  if (!std::filesystem::exists(spec_path)) {
    RETURN_IF_ERROR(Env::Default()->CreateDirs(spec_.checkpoint().dir()));
    ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> f,
                     Env::Default()->NewWritableFile(spec_path + ".tmp"));
    RETURN_IF_ERROR(f->Append(JobSpecToJson(spec_, /*pretty=*/true)));
    RETURN_IF_ERROR(f->Sync());
    RETURN_IF_ERROR(f->Close());
    RETURN_IF_ERROR(Env::Default()->RenameFile(spec_path + ".tmp", spec_path));
  }
  ckpt::CheckpointMeta meta;
  meta.job_id = job_id_;
  meta.checkpoint_id = checkpoint_id;
  meta.optimizer_update_id = update_id;
  meta.scheduler_step = scheduler_step;
  meta.window_id = window_id;
  meta.epoch = window_id > 0 ? planner_->EpochOf(window_id) : 0;
  meta.loss_scale = loss_scale;
  meta.spec_hash = JobSpecHash(spec_);
  meta.next_window_id = window_id + 1;
  meta.written_unix_ms = absl::ToUnixMillis(absl::Now());
  if (last_eval_.has_value() && last_eval_->first <= update_id) {
    meta.eval_update_id = last_eval_->first;
    meta.eval_loss = last_eval_->second;
  }
  // Copied off the device now, written and acknowledged in the background (checkpoint_writer.h);
  // Submit first waits for the previous one's write.
  phase_->Enter(v1::COMPUTE_PHASE_CHECKPOINT);
  return checkpoints_->Submit(meta, replica_->ModelTensors(), replica_->OptimizerTensors());
}

absl::Status Worker::AckCheckpoint(const ckpt::CheckpointMeta& meta, const std::string& path) {
  v1::AckCheckpointRequest ack;
  ack.set_job_id(job_id_);
  // Read on the writer's thread: member_id() changes only with a new assignment, and the
  // checkpoint in flight is flushed before the worker waits for one.
  ack.set_worker_id(link_->member_id());
  ack.set_checkpoint_id(meta.checkpoint_id);
  ack.set_optimizer_update_id(meta.optimizer_update_id);
  ack.set_path(path);
  RETURN_IF_ERROR(client_->AckCheckpoint(ack));
  failed_checkpoint_.reset();  // a later checkpoint is durable: no earlier one is owed
  LogInfo(absl::StrCat("checkpoint ", meta.checkpoint_id, " (update ", meta.optimizer_update_id,
                       ") at ", path));
  return absl::OkStatus();
}

void Worker::CheckpointFailed(const ckpt::CheckpointMeta& meta, const absl::Status& why) {
  LogError(absl::StrCat("checkpoint ", meta.checkpoint_id, " (update ", meta.optimizer_update_id,
                        ") could not be written: ", why.message(),
                        "; the previous durable checkpoint stays, and training goes on"));
  if (options_.metrics != nullptr) options_.metrics->AddCheckpointFailure();
  failed_checkpoint_ = meta;  // read by the training thread after Flush
  v1::AckCheckpointRequest report;
  report.set_job_id(job_id_);
  report.set_worker_id(link_->member_id());
  report.set_checkpoint_id(meta.checkpoint_id);
  report.set_optimizer_update_id(meta.optimizer_update_id);
  report.set_error(std::string(why.message()).substr(0, 1024));
  // Best effort: the coordinator only counts it; the checkpoint stays undurable either way.
  if (absl::Status s = client_->AckCheckpoint(report); !s.ok()) {
    LogWarning(absl::StrCat("could not report the failed checkpoint: ", s.message()));
  }
}

absl::Status Worker::WriteFinalCheckpointAgain() {
  phase_->Enter(v1::COMPUTE_PHASE_CHECKPOINT);
  while (failed_checkpoint_.has_value() &&
         failed_checkpoint_->optimizer_update_id == link_->applied_update()) {
    // The job's end waits for its final checkpoint, and the replica still holds that update:
    // write it again once the disk may have room (a failure that stays is seen in the log).
    if (link_->AwaitJobEnd(kCheckpointRetryEvery).ok()) return absl::OkStatus();
    const ckpt::CheckpointMeta meta = *std::exchange(failed_checkpoint_, std::nullopt);
    LogInfo(
        absl::StrCat("writing checkpoint ", meta.checkpoint_id, " again (the job ends with it)"));
    RETURN_IF_ERROR(
        checkpoints_->Submit(meta, replica_->ModelTensors(), replica_->OptimizerTensors()));
    RETURN_IF_ERROR(checkpoints_->Flush());
  }
  return absl::OkStatus();
}

Worker::WindowPlan Worker::PlanWindow(const v1::Assignment& a, int64_t window_id) const {
  WindowPlan plan;
  plan.micro_batches = planner_->RankMicroBatches(window_id, a.rank(), a.world_size());
  for (const std::vector<int64_t>& mb : plan.micro_batches) {
    plan.units += replica_->token_level() ? data::ValidTokens(*dataset_, mb)
                                          : static_cast<int64_t>(mb.size());
  }
  return plan;
}

v1::BeginWindowRequest Worker::BeginRequest(const v1::Assignment& a, int64_t window_id,
                                            int64_t units) const {
  v1::BeginWindowRequest begin;
  begin.set_job_id(job_id_);
  begin.set_worker_id(link_->member_id());
  begin.set_generation(a.generation());
  begin.set_window_id(window_id);
  begin.set_rank(a.rank());
  begin.set_valid_units(units);
  return begin;
}

bool Worker::PipelinesAfter(int64_t window_id, const v1::BeginWindowResponse& b) const {
  if (!options_.pipeline_begin) return false;
  // b.optimizer_update_id() is the update before this window; it makes at most one more.
  const int64_t update_after = b.optimizer_update_id() + 1;
  const v1::Stop& stop = spec_.stop();
  if (stop.has_max_updates() && update_after >= stop.max_updates()) return false;
  const int64_t total = JobTotalWindows(spec_, planner_->windows_per_epoch());
  if (total > 0 && window_id >= total) return false;
  // The coordinator holds the next begin barrier until an evaluation due after this window
  // ends: no answer could come with the decision.
  const int64_t eval_every = spec_.has_eval() ? spec_.eval().every_updates() : 0;
  return !(eval_every > 0 && update_after % eval_every == 0);
}

std::optional<Worker::NextBegin> Worker::TakeNextBegin(const v1::Assignment& a, int64_t window_id) {
  std::optional<NextBegin> next = std::exchange(next_begin_, std::nullopt);
  if (!next.has_value()) return std::nullopt;
  const v1::BeginWindowRequest& r = next->request;
  // Its answer follows the previous window's decision: usable only once that decision was
  // applied here, and only by the window and generation it was sent for.
  if (r.generation() != a.generation() || r.window_id() != window_id || r.rank() != a.rank() ||
      r.worker_id() != link_->member_id() || applied_window_ != window_id - 1) {
    return std::nullopt;
  }
  return next;
}

absl::StatusOr<v1::WindowDecision> Worker::RunWindow(const v1::Assignment& a, int64_t window_id) {
  WindowPlan plan;
  v1::BeginWindowRequest begin;
  absl::StatusOr<v1::BeginWindowResponse> b = absl::UnknownError("not sent");
  std::string answered_by;
  if (std::optional<NextBegin> ahead = TakeNextBegin(a, window_id)) {
    plan = std::move(ahead->plan);
    begin = std::move(ahead->request);
    b = std::move(ahead->answer);
    answered_by = std::move(ahead->answered_by);
  } else {
    // Not answered ahead: sent now. Idempotent: a report that rode on the previous window's
    // CompleteWindow and was counted then is counted once.
    plan = PlanWindow(a, window_id);
    begin = BeginRequest(a, window_id, plan.units);
    phase_->Enter(v1::COMPUTE_PHASE_REPORT);
    b = client_->BeginWindow(begin);
    if (b.ok()) answered_by = link_->Snapshot().coordinator_id;
  }
  if (!b.ok()) return AbortedOrError(b.status());
  const std::vector<std::vector<int64_t>>& micro_batches = plan.micro_batches;
  const int64_t units = plan.units;
  if (b->has_decision()) {  // ended at the barrier (nothing to train): nothing to undo
    replica_->ZeroGrad();
    applied_window_ = window_id;
    return b->decision();
  }
  // Past the barrier: the next window's n_r is known already; its report rides on this
  // window's CompleteWindow, and its barrier passes in the round of this window's decision.
  std::optional<NextBegin> next;
  if (PipelinesAfter(window_id, *b)) {
    next.emplace();
    next->plan = PlanWindow(a, window_id + 1);
    next->request = BeginRequest(a, window_id + 1, next->plan.units);
  }

  {
    absl::MutexLock lock(&begin_mu_);
    begun_ = begin;
    begun_with_ = answered_by;
  }
  auto end_resend = absl::MakeCleanup([this] { EndBeginResend(); });  // on every way out
  // The window, and once more if the coordinator finds it suspicious (spec.validate): the
  // same weights, data and loss scale, to tell a fault on a rank from the data.
  ASSIGN_OR_RETURN(WindowRun run, ComputeWindow(a, window_id, /*run=*/1, micro_batches, *b));
  absl::StatusOr<v1::CompleteWindowResponse> c =
      ReportWindow(a, window_id, units, micro_batches, run, next);
  if (c.ok() && c->rerun() == 2 && !c->has_decision()) {
    LogWarning(absl::StrCat("window ", window_id,
                            " looks suspicious to the coordinator: computing it again before "
                            "its decision (spec.validate)"));
    replica_->ZeroGrad();
    ASSIGN_OR_RETURN(run, ComputeWindow(a, window_id, /*run=*/2, micro_batches, *b));
    ASSIGN_OR_RETURN(run.sample_losses, SampleLosses(micro_batches));
    c = ReportWindow(a, window_id, units, micro_batches, run, next);
  }
  if (!c.ok()) return AbortedOrError(c.status());  // RunGeneration zeroes the gradients
  if (!c->has_decision()) {
    return absl::InternalError(absl::StrCat("the coordinator answered run ", run.number,
                                            " of window ", window_id,
                                            " with neither a decision nor a re-run"));
  }
  const v1::WindowDecision& d = c->decision();
  ApplyDecision(d);
  if (d.outcome() != v1::ABORT) applied_window_ = window_id;
  if (next.has_value() && c->has_next() && d.outcome() != v1::ABORT) {
    next->answer = c->next();
    next->answered_by = link_->Snapshot().coordinator_id;
    next_begin_ = std::move(next);
  }
  if (options_.metrics != nullptr) {
    options_.metrics->AddMicroSteps(static_cast<int64_t>(micro_batches.size()));
    options_.metrics->AddAllReduce(run.reduced.calls, run.reduced.bytes);
    if (d.outcome() == v1::COMMIT) options_.metrics->AddTokens(units);
    options_.metrics->ObservePhase("forward", run.times.forward_seconds);
    options_.metrics->ObservePhase("backward", run.times.backward_seconds);
    options_.metrics->ObservePhase("allreduce", run.reduce_seconds);
    if (run.overlapped_seconds.has_value()) {
      options_.metrics->ObservePhase("allreduce_overlapped", *run.overlapped_seconds);
    }
  }
  return d;
}

absl::StatusOr<Worker::WindowRun> Worker::ComputeWindow(
    const v1::Assignment& a, int64_t window_id, int32_t run_number,
    const std::vector<std::vector<int64_t>>& micro_batches, const v1::BeginWindowResponse& b) {
  const double scale = b.loss_scale();
  WindowRun run;
  // The window's one synchronisation: bucketed all-reduce (SUM) of the accumulated grads,
  // each bucket launched inside the last backward once its gradients are final (overlapped),
  // or all after backward. Either way one pass, the same buckets, the same sums.
  std::unique_ptr<PendingAllReduce> pending;
  GradientReadyFn on_ready;
  if (OverlapsAllReduce(window_id, a.rank())) {
    pending = collective_->StartAllReduceSum(replica_->BucketGradients());
    on_ready = [p = pending.get()](size_t position, const at::Tensor& grad) {
      p->MarkReady(position, grad);
    };
  }
  ASSIGN_OR_RETURN(run.loss_sum,
                   RunMicroSteps(a, micro_batches, b.global_valid_units(), scale, &run.times,
                                 pending != nullptr ? &on_ready : nullptr));
  run.loss_sum = options_.faults->AfterMicroSteps(window_id, run_number, run.loss_sum);
  const absl::Time backward_end = absl::Now();
  // Only a window that does not overlap: its gradients change before any bucket leaves.
  if (pending == nullptr)
    options_.faults->BeforeAllReduce(window_id, a.rank(), run_number, *replica_);
  // What this rank computed, before the sum mixes it with the others' (validate never
  // overlaps: the whole local gradient exists here).
  if (Validates()) run.grad_checksum = replica_->GradientChecksum();

  const Stopwatch reduce_watch;
  phase_->Enter(v1::COMPUTE_PHASE_ALLREDUCE);
  absl::StatusOr<AllReduceStats> reduced =
      pending != nullptr ? pending->Finish(replica_->BucketGradients())
                         : collective_->AllReduceSum(replica_->BucketGradients());
  {
    // Past the all-reduce every rank passed the barrier: no report needs sending again (one
    // already sent again is joined when the window ends).
    absl::MutexLock lock(&begin_mu_);
    begun_.reset();
  }
  if (!reduced.ok()) return reduced.status();
  run.reduced = *reduced;
  // What the window waited for after backward; what ran behind backward is reported apart.
  run.reduce_seconds = reduce_watch.Seconds();
  if (pending != nullptr) {
    const std::optional<absl::Time> first = pending->first_launch();
    run.overlapped_seconds = first.has_value() && *first < backward_end
                                 ? absl::ToDoubleSeconds(backward_end - *first)
                                 : 0.0;
  }
  pending.reset();
  if (run_number == 1) options_.faults->AfterAllReduce(window_id, scale, *replica_);
  phase_->Enter(v1::COMPUTE_PHASE_OPTIMIZER);  // unscaling and the norm: its own work again
  run.check = replica_->UnscaleAndNorm(scale);
  run.number = run_number;
  return run;
}

absl::StatusOr<v1::CompleteWindowResponse> Worker::ReportWindow(
    const v1::Assignment& a, int64_t window_id, int64_t units,
    const std::vector<std::vector<int64_t>>& micro_batches, const WindowRun& run,
    const std::optional<NextBegin>& next) {
  v1::CompleteWindowRequest complete;
  complete.set_job_id(job_id_);
  complete.set_worker_id(link_->member_id());
  complete.set_generation(a.generation());
  complete.set_window_id(window_id);
  complete.set_rank(a.rank());
  complete.set_loss_sum(run.loss_sum);
  complete.set_valid_units(units);
  complete.set_found_inf(run.check.found_inf);
  complete.set_grad_norm(run.check.grad_norm);
  if (run.check.grad_norm_scaled.has_value()) {
    complete.set_grad_norm_scaled(*run.check.grad_norm_scaled);
  }
  complete.set_micro_steps(static_cast<int64_t>(micro_batches.size()));
  complete.set_allreduce_calls(run.reduced.calls);
  if (next.has_value()) *complete.mutable_next() = next->request;
  v1::WindowPhases* phases = complete.mutable_phases();
  phases->set_data_seconds(run.times.data_seconds);
  phases->set_compute_seconds(run.times.forward_seconds + run.times.backward_seconds);
  phases->set_allreduce_seconds(run.reduce_seconds);
  phases->set_coordinator_seconds(last_decision_wait_seconds_);
  if (run.number > 1) complete.set_run(run.number);
  if (run.grad_checksum.has_value()) complete.set_grad_checksum(*run.grad_checksum);
  for (const v1::SampleLoss& s : run.sample_losses) *complete.add_sample_losses() = s;
  const Stopwatch decision_wait;
  phase_->Enter(v1::COMPUTE_PHASE_REPORT);
  absl::StatusOr<v1::CompleteWindowResponse> c = client_->CompleteWindow(complete);
  last_decision_wait_seconds_ = decision_wait.Seconds();
  return c;
}

absl::StatusOr<std::vector<v1::SampleLoss>> Worker::SampleLosses(
    const std::vector<std::vector<int64_t>>& micro_batches) {
  // One forward per sample, no gradient: only in a re-run, which is rare and about to name
  // the data if the window reproduces.
  std::vector<v1::SampleLoss> losses;
  for (const std::vector<int64_t>& mb : micro_batches) {
    for (const int64_t id : mb) {
      data::MicroBatch one = data::Collate(*dataset_, {id});
      options_.faults->PoisonSamples({id}, one);
      ASSIGN_OR_RETURN(const double loss, replica_->EvalLossSum(one));
      v1::SampleLoss& s = losses.emplace_back();
      s.set_sample_id(id);
      s.set_loss(loss);
    }
  }
  // Worst first: a non-finite loss above any finite one.
  const auto badness = [](double l) {
    return std::isfinite(l) ? l : std::numeric_limits<double>::infinity();
  };
  std::stable_sort(losses.begin(), losses.end(),
                   [&](const v1::SampleLoss& x, const v1::SampleLoss& y) {
                     return badness(x.loss()) > badness(y.loss());
                   });
  if (losses.size() > kReportedSampleLosses) losses.resize(kReportedSampleLosses);
  return losses;
}

bool Worker::Validates() const { return !spec_.validate().rerun_on().empty(); }

bool Worker::OverlapsAllReduce(int64_t window_id, int32_t rank) const {
  return options_.overlap_allreduce && !device_.is_cuda() && replica_->gradient_hooks() &&
         !Validates() && !options_.faults->ChangesGradientsBeforeAllReduce(window_id, rank);
}

absl::StatusOr<double> Worker::RunMicroSteps(const v1::Assignment& a,
                                             const std::vector<std::vector<int64_t>>& micro_batches,
                                             int64_t global_units, double loss_scale,
                                             MicroStepTimes* times,
                                             const GradientReadyFn* last_ready) {
  // Micro-steps 1..K: no collective call anywhere in here (no_sync); the hooks of the last
  // backward may launch buckets (its gradients are then final).
  double loss_sum = 0.0;
  for (size_t k = 0; k < micro_batches.size(); ++k) {
    const std::vector<int64_t>& mb = micro_batches[k];
    const Stopwatch collate;
    phase_->Enter(v1::COMPUTE_PHASE_DATA);
    data::MicroBatch batch = data::Collate(*dataset_, mb);
    options_.faults->PoisonSamples(mb, batch);
    times->data_seconds += collate.Seconds();
    const int64_t micro_units = replica_->token_level() ? batch.valid_tokens : batch.samples;
    const double multiplier =
        BackwardMultiplier(spec_.loss().normalization(), loss_scale, global_units, micro_units,
                           spec_.batch().accumulation_steps(), a.world_size());
    MicroStepTimes t;
    phase_->Enter(v1::COMPUTE_PHASE_FORWARD_BACKWARD);
    ASSIGN_OR_RETURN(double l,
                     replica_->MicroStep(batch, multiplier, &t,
                                         k + 1 == micro_batches.size() ? last_ready : nullptr));
    loss_sum += l;
    // A slowed rank (fault injection) takes longer in backward, as on a slow device.
    t.backward_seconds += absl::ToDoubleSeconds(
        options_.faults->AfterMicroStep(absl::Seconds(t.forward_seconds + t.backward_seconds)));
    times->forward_seconds += t.forward_seconds;
    times->backward_seconds += t.backward_seconds;
  }
  return loss_sum;
}

void Worker::ResendBeginIfCoordinatorRestarted() {
  absl::MutexLock lock(&begin_mu_);
  if (!begun_.has_value() || begin_resend_.joinable() || begun_with_.empty()) return;
  const std::string now_id = link_->Snapshot().coordinator_id;
  if (now_id.empty() || now_id == begun_with_) return;
  LogWarning(absl::StrCat("the coordinator restarted during window ", begun_->window_id(),
                          ": sending its begin report again"));
  // Idempotent: the restarted coordinator counts it once; its answer is not needed here.
  begin_resend_ = std::thread([this, req = *begun_] { (void)client_->BeginWindow(req); });
}

void Worker::EndBeginResend() {
  std::thread resend;
  {
    absl::MutexLock lock(&begin_mu_);
    begun_.reset();
    resend = std::move(begin_resend_);
  }
  if (resend.joinable()) resend.join();
}

void Worker::ApplyDecision(const v1::WindowDecision& d) {
  const absl::Time start = absl::Now();
  phase_->Enter(v1::COMPUTE_PHASE_OPTIMIZER);
  if (d.outcome() == v1::COMMIT) {
    checkpoints_->BeforeParametersChange();  // a checkpoint still being copied sees no change
    replica_->Commit(d.clip_coef(), d.learning_rate());
  } else {
    replica_->ZeroGrad();
  }
  if (options_.metrics != nullptr) {
    options_.metrics->ObservePhase("optimizer", absl::ToDoubleSeconds(absl::Now() - start));
  }
}

absl::Status Worker::RunEval(const v1::Assignment& a, int64_t update_id) {
  const absl::Time start = absl::Now();
  phase_->Enter(v1::COMPUTE_PHASE_EVAL);
  const std::vector<std::vector<int64_t>> micro_batches =
      EvalMicroBatches(eval_dataset_->size(), spec_.batch().micro_batch_size(),
                       spec_.eval().max_batches(), a.rank(), a.world_size());
  double loss_sum = 0.0;
  int64_t units = 0;
  for (const std::vector<int64_t>& mb : micro_batches) {
    data::MicroBatch batch = data::Collate(*eval_dataset_, mb);
    ASSIGN_OR_RETURN(double l, replica_->EvalLossSum(batch));
    loss_sum += l;
    units += replica_->token_level() ? batch.valid_tokens : batch.samples;
  }
  options_.faults->InEval(update_id);
  v1::ReportEvalRequest req;
  req.set_job_id(job_id_);
  req.set_worker_id(link_->member_id());
  req.set_generation(a.generation());
  req.set_rank(a.rank());
  req.set_optimizer_update_id(update_id);
  req.set_loss_sum(loss_sum);
  req.set_valid_units(units);
  phase_->Enter(v1::COMPUTE_PHASE_REPORT);
  ASSIGN_OR_RETURN(v1::ReportEvalResponse r, client_->ReportEval(req));
  last_eval_.emplace(update_id, r.eval_loss());
  LogInfo(absl::StrCat("eval after update ", update_id, ": loss ", r.eval_loss(), " over ",
                       r.valid_units(), replica_->token_level() ? " tokens" : " samples", " (",
                       units, " here, ", absl::FormatDuration(absl::Now() - start), ")"));
  return absl::OkStatus();
}

absl::StatusOr<Worker::GenerationEnd> Worker::JoinAndRun(const v1::Assignment& a) {
  phase_->Enter(v1::COMPUTE_PHASE_JOIN);
  collective_.reset();
  absl::StatusOr<std::unique_ptr<Collective>> c =
      Collective::Connect(shared_client_, job_id_, a, options_.collective);
  if (!c.ok()) return RejoinOrFail(c.status(), "joining the collective");
  collective_ = std::move(*c);
  if (absl::Status s = SyncState(a); !s.ok()) return RejoinOrFail(s, "state sync");
  return RunGeneration(a);
}

absl::StatusOr<Worker::GenerationEnd> Worker::RunGeneration(const v1::Assignment& a) {
  // The replica holds the state from before a.next_window_id(). A BeginWindow sent ahead
  // never outlives the generation (abort, rollback, the stop, an error): its answer is dropped.
  applied_window_ = a.next_window_id() - 1;
  auto drop_next_begin = absl::MakeCleanup([this] { next_begin_.reset(); });
  // The coordinator's word on the latest evaluation (a rollback may have erased ours).
  if (a.has_last_eval_loss()) {
    last_eval_.emplace(a.last_eval_update_id(), a.last_eval_loss());
  } else {
    last_eval_.reset();
  }
  // An evaluation a lost rank interrupted comes first: the replicas hold that update's weights,
  // and a pending final checkpoint should carry its result.
  if (a.has_pending_eval_update_id()) {
    if (absl::Status s = RunEval(a, a.pending_eval_update_id()); !s.ok()) {
      return RejoinOrFail(s, "eval");
    }
  }
  if (a.rank() == 0 && a.has_pending_checkpoint_id()) {
    RETURN_IF_ERROR(WriteCheckpoint(a.pending_checkpoint_id(), a.optimizer_update_id(),
                                    a.next_window_id() - 1, a.scheduler_step(), a.loss_scale()));
  }
  for (int64_t window = a.next_window_id();; ++window) {
    // Reading the window's data starts here (a hold before it is a stuck read).
    phase_->Enter(v1::COMPUTE_PHASE_DATA);
    options_.faults->BeforeWindow(window);
    absl::StatusOr<v1::WindowDecision> d = RunWindow(a, window);
    if (!d.ok()) {
      replica_->ZeroGrad();
      return RejoinOrFail(d.status(), absl::StrCat("window ", window));
    }
    if (d->outcome() == v1::ABORT) {
      replica_->ZeroGrad();  // nothing of an aborted window is kept
      LogWarning(absl::StrCat("window ", window, " aborted (", d->reason(), "); rejoining"));
      return GenerationEnd::kRejoin;
    }
    link_->SetAppliedUpdate(d->optimizer_update_id());
    if (d->run_eval()) {
      // Like a window: a rank lost during the evaluation aborts it for everyone (the barrier
      // answers ABORTED) and the next generation evaluates the same weights again.
      if (absl::Status s = RunEval(a, d->optimizer_update_id()); !s.ok()) {
        return RejoinOrFail(s, absl::StrCat("eval after update ", d->optimizer_update_id()));
      }
    }
    if (d->write_checkpoint() && a.rank() == 0) {
      RETURN_IF_ERROR(WriteCheckpoint(d->checkpoint_id(), d->optimizer_update_id(), window,
                                      d->scheduler_step(), d->record().loss_scale()));
    }
    if (d->job_done()) return GenerationEnd::kJobDone;
  }
}

WorkerExit Worker::Run() {
  // The worker's edge: any exception still escaping LibTorch fails the job with its message
  // instead of leaving the other ranks waiting for a process that vanished.
  try {
    return RunOrThrow();
  } catch (const std::exception& e) {
    absl::Status s = absl::InternalError(absl::StrCat("unexpected error: ", ShortWhat(e)));
    Fail(s);
    return {1, std::string(s.message())};
  }
}

WorkerExit Worker::RunOrThrow() {
  absl::Status setup = Setup();
  if (!setup.ok()) return {1, std::string(setup.message())};
  int64_t after = 0;
  while (true) {
    phase_->Enter(v1::COMPUTE_PHASE_IDLE);
    absl::StatusOr<v1::Assignment> a = link_->AwaitAssignment(after);
    if (!a.ok()) {
      if (!link_->Snapshot().drained.empty()) {
        // Replaced by a standby at a window boundary: nothing of this replica is needed, and
        // exit 0 keeps Kubernetes from counting it as a failure.
        LogWarning(a.status().message());
        collective_.reset();
        return {0, std::string(a.status().message())};
      }
      if (JobOver()) break;
      return {1, std::string(a.status().message())};
    }
    LogInfo(absl::StrCat("generation ", a->generation(), ": rank ", a->rank(), " of ",
                         a->world_size(), ", from window ", a->next_window_id(), ", state from ",
                         v1::Assignment::StateSource_Name(a->state_source())));
    absl::StatusOr<GenerationEnd> end = JoinAndRun(*a);
    // Whatever ended the generation, the checkpoint in flight is finished first: the next
    // generation may restore the parameters in place. A write that failed was reported and
    // training goes on (CheckpointFailed); an acknowledgement that failed fails the job.
    phase_->Enter(v1::COMPUTE_PHASE_CHECKPOINT);
    if (absl::Status written = checkpoints_->Flush(); !written.ok()) {
      if (end.ok()) {
        end = written;
      } else {
        LogError(absl::StrCat("checkpoint: ", written.message()));
      }
    }
    if (!end.ok()) {
      if (JobOver()) break;  // its end, not this worker's failure
      Fail(end.status());
      return {1, std::string(end.status().message())};
    }
    if (*end == GenerationEnd::kJobDone) {
      if (absl::Status s = WriteFinalCheckpointAgain(); !s.ok()) {
        Fail(s);
        return {1, std::string(s.message())};
      }
      // Rank 0 may still be writing the final checkpoint; everyone stays until the job ends,
      // in case a survivor is needed to finish it.
      if (absl::Status s = link_->AwaitJobEnd(absl::Minutes(30)); !s.ok()) {
        return {1, std::string(s.message())};
      }
      break;
    }
    after = a->generation();
  }
  collective_.reset();
  return {0, JobEndMessage(job_id_, link_->Snapshot())};
}

bool Worker::JobOver() {
  if (link_->Snapshot().job_over) return true;
  // Bounded: an unreachable coordinator must not keep a failed worker from exiting.
  return link_->Fresh(absl::Seconds(5)).job_over;
}

}  // namespace trainstep
