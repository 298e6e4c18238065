#include "worker/worker.h"

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/env.h"
#include "common/log.h"
#include "common/spec.h"
#include "common/status_macros.h"
#include "worker/bf16_probe.h"
#include "worker/checkpoint/checkpoint_dir.h"
#include "worker/data/collate.h"
#include "worker/device.h"
#include "worker/generate.h"
#include "worker/loss.h"
#include "worker/torch_status.h"

namespace trainstep {
namespace {

void Nap(absl::Duration d) {
  std::this_thread::sleep_for(std::chrono::microseconds(absl::ToInt64Microseconds(d)));
}

bool Terminal(v1::JobState s) {
  return s == v1::SUCCEEDED || s == v1::FAILED || s == v1::CANCELLED;
}

// A report refused as stale (ABORTED) means the window was aborted under this rank: the
// same outcome as an ABORT decision. Other errors stay errors.
absl::StatusOr<v1::WindowDecision> AbortedOrError(const absl::Status& s) {
  if (s.code() != absl::StatusCode::kAborted) return s;
  v1::WindowDecision d;
  d.set_outcome(v1::ABORT);
  d.set_reason(std::string(s.message()));
  return d;
}

// The collective and store calls fail with UNAVAILABLE when a peer or the generation is
// gone: the worker rejoins. Anything else is this worker's own failure.
bool IsRejoinable(const absl::Status& s) {
  return s.code() == absl::StatusCode::kUnavailable || s.code() == absl::StatusCode::kAborted ||
         s.code() == absl::StatusCode::kDeadlineExceeded;
}

}  // namespace

Worker::Worker(WorkerOptions options) : options_(std::move(options)) {
  if (options_.name.empty()) {
    char host[256] = {0};
    gethostname(host, sizeof(host) - 1);
    options_.name = absl::StrCat(host, "-", getpid());
  }
}

Worker::~Worker() {
  if (!stop_heartbeats_.HasBeenNotified()) stop_heartbeats_.Notify();
  if (heartbeats_.joinable()) heartbeats_.join();
}

void Worker::Fail(const absl::Status& status) {
  LogError(status.ToString());
  if (client_ == nullptr || job_id_.empty()) return;
  v1::ReportFailureRequest req;
  req.set_job_id(job_id_);
  req.set_worker_id(WorkerId());
  req.set_message(std::string(status.message()));
  (void)client_->ReportFailure(req);
}

std::string Worker::WorkerId() const {
  absl::MutexLock lock(&mu_);
  return worker_id_;
}

absl::Status Worker::Register() {
  const bool again = !job_id_.empty();
  v1::RegisterWorkerRequest reg;
  reg.set_job_id(again ? job_id_ : options_.job_id);
  reg.set_name(options_.name);
  reg.set_host(options_.collective.host);
  reg.set_request_id(absl::StrCat(options_.name, "/", absl::ToUnixNanos(absl::Now())));
  absl::StatusOr<v1::RegisterWorkerResponse> r = client_->RegisterWorker(reg);
  if (!r.ok()) {
    return absl::Status(r.status().code(),
                        absl::StrCat("cannot register with the coordinator at ",
                                     options_.coordinator, ": ", r.status().message()));
  }
  if (!again) {  // only before the heartbeat thread exists
    job_id_ = r->job_id();
    spec_ = r->spec();
    heartbeat_every_ = absl::Milliseconds(std::max<int64_t>(50, r->heartbeat_interval_ms()));
  }
  absl::MutexLock lock(&mu_);
  worker_id_ = r->worker_id();
  // The new identity has no dataset accepted yet: the next heartbeat reports it.
  last_heartbeat_ = v1::HeartbeatResponse();
  LogInfo(absl::StrCat("registered", again ? " again" : "", " as ", worker_id_, " of ", job_id_,
                       " (", spec_.name(), ")"));
  return absl::OkStatus();
}

absl::Status Worker::Setup() {
  WorkerClientOptions copts;
  // Re-sent every 2 s, so a wait notices within a heartbeat that its generation is gone.
  copts.barrier_poll = absl::Seconds(2);
  copts.keep_waiting = [this] { return !job_over_ && !refused_ && !GenerationSuperseded(); };
  copts.connect_timeout = options_.connect_timeout;
  // Every failed attempt to reach the coordinator is logged: the first, then every 10 s.
  copts.on_connect_retry = [this, next_log = absl::InfinitePast()](const absl::Status& s) mutable {
    const absl::Time now = absl::Now();
    if (now < next_log) return;
    next_log = now + absl::Seconds(10);
    LogWarning(absl::StrCat(
        "cannot reach the coordinator at ", options_.coordinator, " yet (",
        absl::StatusCodeToString(s.code()), ": ", s.message(), "); retrying",
        options_.connect_timeout > absl::ZeroDuration()
            ? absl::StrCat(" for up to ", absl::FormatDuration(options_.connect_timeout),
                           " (--connect-timeout)")
            : " until it answers (--connect-timeout 0)"));
  };
  client_ = std::make_unique<WorkerClient>(MakeChannel(options_.coordinator), copts);
  RETURN_IF_ERROR(Register());
  // Before anything reads or writes a path of the spec: it comes from whoever submitted it.
  if (absl::Status s = CheckSpecPaths(spec_, options_.allowed_roots); !s.ok()) {
    Fail(s);
    return s;
  }
  if (options_.metrics != nullptr) options_.metrics->SetJob(job_id_);
  device_ = options_.collective.device;
  UseDeviceInThisThread(device_);
  checkpoints_ = std::make_unique<CheckpointWriter>(
      spec_.checkpoint().dir(), spec_.checkpoint().keep_last(),
      [this](const ckpt::CheckpointMeta& meta, const std::string& path) {
        return AckCheckpoint(meta, path);
      });
  if (spec_.precision() == v1::JobSpec::bf16 && !device_.is_cuda()) LogBf16Notice(options_.cpu);

  // Heartbeats start before the (possibly long) data load, so the lease holds meanwhile.
  heartbeats_ = std::thread([this] { HeartbeatLoop(); });

  absl::StatusOr<data::Dataset> d = data::Dataset::Load(spec_, options_.allowed_roots);
  if (!d.ok()) {
    Fail(d.status());
    return d.status();
  }
  dataset_ = std::move(*d);
  if (spec_.has_eval()) {
    // The held-out data loads as the training data does, with its own field path in errors.
    v1::JobSpec eval_spec = spec_;
    *eval_spec.mutable_data() = spec_.eval().data();
    absl::StatusOr<data::Dataset> e = data::Dataset::Load(eval_spec);
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
  planner_ = std::make_unique<data::WindowPlanner>(spec_, dataset_->size());
  {
    // The heartbeat thread reports the dataset from here on.
    absl::MutexLock lock(&mu_);
    dataset_report_.set_samples(dataset_->size());
    dataset_report_.set_fingerprint(dataset_->fingerprint());
  }
  absl::StatusOr<std::unique_ptr<Replica>> replica = Replica::Create(spec_, device_);
  if (!replica.ok()) {
    Fail(replica.status());
    return replica.status();
  }
  replica_ = std::move(*replica);
  LogInfo(absl::StrCat(dataset_->size(), " samples (fingerprint ", dataset_->fingerprint(), "), ",
                       planner_->windows_per_epoch(), " windows per epoch"));
  return absl::OkStatus();
}

void Worker::HeartbeatLoop() {
  while (!stop_heartbeats_.HasBeenNotified()) {
    v1::HeartbeatRequest req;
    req.set_job_id(job_id_);
    req.set_worker_id(WorkerId());
    req.set_applied_update_id(applied_update_);
    {
      absl::MutexLock lock(&mu_);
      if (dataset_report_.samples() > 0 && !last_heartbeat_.dataset_accepted()) {
        *req.mutable_dataset() = dataset_report_;
      }
    }
    absl::StatusOr<v1::HeartbeatResponse> r = client_->Heartbeat(req);
    if (r.ok()) {
      if (Terminal(r->job_state())) job_over_ = true;
      NoteAssignment(*r);
      absl::MutexLock lock(&mu_);
      last_heartbeat_ = *r;
    } else if (r.status().code() == absl::StatusCode::kNotFound && req.worker_id() == WorkerId()) {
      // Declared lost (its lease expired: a partition, a pause of this process). Its replica
      // is intact: take a new identity and rejoin as a standby; the window in flight was
      // aborted for everyone, so nothing is lost.
      LogWarning(absl::StrCat(r.status().message(), "; registering again to rejoin"));
      if (absl::Status s = Register(); !s.ok()) {
        LogError(s.ToString());
        refused_ = true;
        absl::MutexLock lock(&mu_);
        last_heartbeat_.set_job_message(std::string(s.message()));
      }
    } else if (r.status().code() == absl::StatusCode::kFailedPrecondition) {
      // The dataset refused: this process cannot take part.
      LogError(absl::StrCat("heartbeat refused: ", r.status().message()));
      refused_ = true;
      absl::MutexLock lock(&mu_);
      last_heartbeat_.set_job_message(std::string(r.status().message()));
    }
    stop_heartbeats_.WaitForNotificationWithTimeout(heartbeat_every_);
  }
}

void Worker::NoteAssignment(const v1::HeartbeatResponse& r) {
  // -1: this worker is in no live generation (it broke, or re-formed without us).
  current_generation_ = r.assigned() ? r.assignment().generation() : -1;
}

bool Worker::GenerationSuperseded() const {
  const int64_t joined = joined_generation_.load();
  return joined > 0 && current_generation_.load() != joined;
}

absl::StatusOr<v1::Assignment> Worker::AwaitAssignment(int64_t after_generation) {
  while (true) {
    if (refused_) {
      absl::MutexLock lock(&mu_);
      return absl::FailedPreconditionError(last_heartbeat_.job_message());
    }
    v1::HeartbeatRequest req;
    req.set_job_id(job_id_);
    req.set_worker_id(WorkerId());
    req.set_applied_update_id(applied_update_);
    absl::StatusOr<v1::HeartbeatResponse> r = client_->Heartbeat(req);
    if (r.ok()) {
      if (Terminal(r->job_state())) {
        job_over_ = true;
        return absl::CancelledError(absl::StrCat("job ", v1::JobState_Name(r->job_state()),
                                                 r->job_message().empty() ? "" : ": ",
                                                 r->job_message()));
      }
      if (r->assigned() && r->assignment().generation() > after_generation) {
        NoteAssignment(*r);
        joined_generation_ = r->assignment().generation();
        member_id_ = req.worker_id();
        return r->assignment();
      }
    } else if (r.status().code() != absl::StatusCode::kUnavailable &&
               r.status().code() != absl::StatusCode::kDeadlineExceeded &&
               r.status().code() != absl::StatusCode::kNotFound) {
      return r.status();  // NOT_FOUND: declared lost; the heartbeat thread registers again
    }
    Nap(absl::Milliseconds(50));
  }
}

absl::Status Worker::SyncState(const v1::Assignment& a) {
  switch (a.state_source()) {
    case v1::Assignment::CHECKPOINT: {
      ASSIGN_OR_RETURN(ckpt::LoadedCheckpoint c,
                       ckpt::ReadCheckpoint(spec_.checkpoint().dir(), a.checkpoint_id()));
      RETURN_IF_ERROR(replica_->Restore(c.model, c.optimizer));
      LogInfo(absl::StrCat("restored checkpoint ", a.checkpoint_id(), " (update ",
                           c.meta.optimizer_update_id, ") from ", c.path));
      break;
    }
    case v1::Assignment::INIT: {
      // A rolled-back job restarts from fresh weights; a fresh job already has them.
      if (applied_update_ != 0 || a.optimizer_update_id() != 0) {
        ASSIGN_OR_RETURN(replica_, Replica::Create(spec_, device_));
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
  applied_update_ = a.optimizer_update_id();
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
  // Copied off the device now, written and acknowledged in the background (checkpoint_writer.h).
  return checkpoints_->Submit(meta, replica_->ModelTensors(), replica_->OptimizerTensors());
}

absl::Status Worker::AckCheckpoint(const ckpt::CheckpointMeta& meta, const std::string& path) {
  v1::AckCheckpointRequest ack;
  ack.set_job_id(job_id_);
  // Read on the writer's thread: member_id_ changes only with a new assignment, and the
  // checkpoint in flight is flushed before the worker waits for one.
  ack.set_worker_id(member_id_);
  ack.set_checkpoint_id(meta.checkpoint_id);
  ack.set_optimizer_update_id(meta.optimizer_update_id);
  ack.set_path(path);
  RETURN_IF_ERROR(client_->AckCheckpoint(ack));
  LogInfo(absl::StrCat("checkpoint ", meta.checkpoint_id, " (update ", meta.optimizer_update_id,
                       ") at ", path));
  return absl::OkStatus();
}

absl::StatusOr<v1::WindowDecision> Worker::RunWindow(const v1::Assignment& a, int64_t window_id) {
  const std::vector<std::vector<int64_t>> micro_batches =
      planner_->RankMicroBatches(window_id, a.rank(), a.world_size());
  int64_t units = 0;
  for (const std::vector<int64_t>& mb : micro_batches) {
    units += replica_->token_level() ? data::ValidTokens(*dataset_, mb)
                                     : static_cast<int64_t>(mb.size());
  }
  v1::BeginWindowRequest begin;
  begin.set_job_id(job_id_);
  begin.set_worker_id(member_id_);
  begin.set_generation(a.generation());
  begin.set_window_id(window_id);
  begin.set_rank(a.rank());
  begin.set_valid_units(units);
  absl::StatusOr<v1::BeginWindowResponse> b = client_->BeginWindow(begin);
  if (!b.ok()) return AbortedOrError(b.status());
  if (b->has_decision()) {  // ended at the barrier (nothing to train): nothing to undo
    replica_->ZeroGrad();
    return b->decision();
  }

  // Micro-steps 1..K: no collective call anywhere in here (no_sync).
  const int64_t n = b->global_valid_units();
  const double scale = b->loss_scale();
  double loss_sum = 0.0;
  MicroStepTimes total_times;
  for (const std::vector<int64_t>& mb : micro_batches) {
    data::MicroBatch batch = data::Collate(*dataset_, mb);
    const int64_t micro_units = replica_->token_level() ? batch.valid_tokens : batch.samples;
    const double multiplier =
        BackwardMultiplier(spec_.loss().normalization(), scale, n, micro_units,
                           spec_.batch().accumulation_steps(), a.world_size());
    MicroStepTimes t;
    ASSIGN_OR_RETURN(double l, replica_->MicroStep(batch, multiplier, &t));
    loss_sum += l;
    total_times.forward_seconds += t.forward_seconds;
    total_times.backward_seconds += t.backward_seconds;
  }
  for (int64_t w : spec_.debug().nonfinite_grad_windows()) {
    if (w == window_id && a.rank() == 0) replica_->InjectNonFinite();
  }

  // The window's one synchronisation: bucketed all-reduce (SUM) of the accumulated grads.
  const absl::Time reduce_start = absl::Now();
  absl::StatusOr<AllReduceStats> reduced = collective_->AllReduceSum(replica_->Gradients());
  if (!reduced.ok()) return reduced.status();
  const double reduce_seconds = absl::ToDoubleSeconds(absl::Now() - reduce_start);
  // Test-only desync: after the all-reduce (before it, the SUM would hand every rank the same
  // nudge), so only this rank's gradient, and its reported norm, differ. Scaled by S: it is
  // unscaled next.
  if (options_.perturb_grad_window == window_id) replica_->PerturbGradient(1e-2 * scale);
  const UnscaleResult check = replica_->UnscaleAndCheck(scale);

  v1::CompleteWindowRequest complete;
  complete.set_job_id(job_id_);
  complete.set_worker_id(member_id_);
  complete.set_generation(a.generation());
  complete.set_window_id(window_id);
  complete.set_rank(a.rank());
  complete.set_loss_sum(loss_sum);
  complete.set_valid_units(units);
  complete.set_found_inf(check.found_inf);
  complete.set_grad_norm(check.grad_norm);
  if (check.grad_norm_scaled.has_value()) complete.set_grad_norm_scaled(*check.grad_norm_scaled);
  complete.set_micro_steps(static_cast<int64_t>(micro_batches.size()));
  complete.set_allreduce_calls(reduced->calls);
  absl::StatusOr<v1::CompleteWindowResponse> c = client_->CompleteWindow(complete);
  if (!c.ok()) return AbortedOrError(c.status());  // RunGeneration zeroes the gradients
  const v1::WindowDecision& d = c->decision();
  const absl::Time optimizer_start = absl::Now();
  if (d.outcome() == v1::COMMIT) {
    checkpoints_->BeforeParametersChange();  // a checkpoint still being copied sees no change
    replica_->Commit(d.clip_coef(), d.learning_rate());
  } else {
    replica_->ZeroGrad();
  }
  if (options_.metrics != nullptr) {
    options_.metrics->AddMicroSteps(static_cast<int64_t>(micro_batches.size()));
    options_.metrics->AddAllReduce(reduced->calls, reduced->bytes);
    if (d.outcome() == v1::COMMIT) options_.metrics->AddTokens(units);
    options_.metrics->ObservePhase("forward", total_times.forward_seconds);
    options_.metrics->ObservePhase("backward", total_times.backward_seconds);
    options_.metrics->ObservePhase("allreduce", reduce_seconds);
    options_.metrics->ObservePhase("optimizer",
                                   absl::ToDoubleSeconds(absl::Now() - optimizer_start));
  }
  return d;
}

absl::Status Worker::RunEval(const v1::Assignment& a, int64_t update_id) {
  const absl::Time start = absl::Now();
  const std::vector<std::vector<int64_t>> micro_batches =
      data::EvalMicroBatches(eval_dataset_->size(), spec_.batch().micro_batch_size(),
                             spec_.eval().max_batches(), a.rank(), a.world_size());
  double loss_sum = 0.0;
  int64_t units = 0;
  for (const std::vector<int64_t>& mb : micro_batches) {
    data::MicroBatch batch = data::Collate(*eval_dataset_, mb);
    ASSIGN_OR_RETURN(double l, replica_->EvalLossSum(batch));
    loss_sum += l;
    units += replica_->token_level() ? batch.valid_tokens : batch.samples;
  }
  if (options_.exit_in_eval_update == update_id) {
    LogWarning(
        absl::StrCat("--debug-exit-in-eval: exiting in the evaluation of update ", update_id));
    _exit(3);
  }
  v1::ReportEvalRequest req;
  req.set_job_id(job_id_);
  req.set_worker_id(member_id_);
  req.set_generation(a.generation());
  req.set_rank(a.rank());
  req.set_optimizer_update_id(update_id);
  req.set_loss_sum(loss_sum);
  req.set_valid_units(units);
  ASSIGN_OR_RETURN(v1::ReportEvalResponse r, client_->ReportEval(req));
  last_eval_.emplace(update_id, r.eval_loss());
  LogInfo(absl::StrCat("eval after update ", update_id, ": loss ", r.eval_loss(), " over ",
                       r.valid_units(), replica_->token_level() ? " tokens" : " samples", " (",
                       units, " here, ", absl::FormatDuration(absl::Now() - start), ")"));
  return absl::OkStatus();
}

absl::StatusOr<Worker::GenerationEnd> Worker::RunGeneration(const v1::Assignment& a) {
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
      if (IsRejoinable(s) || s.code() == absl::StatusCode::kNotFound) {
        LogWarning(absl::StrCat("eval: ", s.message(), "; rejoining"));
        return GenerationEnd::kRejoin;
      }
      return s;
    }
  }
  if (a.rank() == 0 && a.has_pending_checkpoint_id()) {
    RETURN_IF_ERROR(WriteCheckpoint(a.pending_checkpoint_id(), a.optimizer_update_id(),
                                    a.next_window_id() - 1, a.scheduler_step(), a.loss_scale()));
  }
  for (int64_t window = a.next_window_id();; ++window) {
    absl::StatusOr<v1::WindowDecision> d = RunWindow(a, window);
    if (!d.ok()) {
      replica_->ZeroGrad();
      // NOT_FOUND: this identity was declared lost; rejoin under the new one.
      if (IsRejoinable(d.status()) || d.status().code() == absl::StatusCode::kNotFound) {
        LogWarning(absl::StrCat("window ", window, ": ", d.status().message(), "; rejoining"));
        return GenerationEnd::kRejoin;
      }
      return d.status();
    }
    if (d->outcome() == v1::ABORT) {
      replica_->ZeroGrad();  // nothing of an aborted window is kept
      LogWarning(absl::StrCat("window ", window, " aborted (", d->reason(), "); rejoining"));
      return GenerationEnd::kRejoin;
    }
    applied_update_ = d->optimizer_update_id();
    if (d->run_eval()) {
      // Like a window: a rank lost during the evaluation aborts it for everyone (the barrier
      // answers ABORTED) and the next generation evaluates the same weights again.
      if (absl::Status s = RunEval(a, d->optimizer_update_id()); !s.ok()) {
        if (IsRejoinable(s) || s.code() == absl::StatusCode::kNotFound) {
          LogWarning(absl::StrCat("eval after update ", d->optimizer_update_id(), ": ", s.message(),
                                  "; rejoining"));
          return GenerationEnd::kRejoin;
        }
        return s;
      }
    }
    if (d->write_checkpoint() && a.rank() == 0) {
      RETURN_IF_ERROR(WriteCheckpoint(d->checkpoint_id(), d->optimizer_update_id(), window,
                                      d->scheduler_step(), d->record().loss_scale()));
    }
    if (d->job_done()) return GenerationEnd::kJobDone;
  }
}

absl::Status Worker::AwaitJobEnd() {
  // Rank 0 may still be writing the final checkpoint; everyone stays until the job ends,
  // in case a survivor is needed to finish it.
  const absl::Time give_up = absl::Now() + absl::Minutes(30);
  while (!job_over_ && !refused_ && absl::Now() < give_up) {
    v1::HeartbeatRequest req;
    req.set_job_id(job_id_);
    req.set_worker_id(WorkerId());
    req.set_applied_update_id(applied_update_);
    absl::StatusOr<v1::HeartbeatResponse> r = client_->Heartbeat(req);
    if (r.ok()) {
      if (Terminal(r->job_state())) job_over_ = true;
      absl::MutexLock lock(&mu_);
      last_heartbeat_ = *r;
    }
    if (!job_over_) Nap(absl::Milliseconds(50));
  }
  return job_over_ ? absl::OkStatus()
                   : absl::DeadlineExceededError("the job did not end after its last window");
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
    absl::StatusOr<v1::Assignment> a = AwaitAssignment(after);
    if (!a.ok()) {
      if (job_over_) break;
      return {1, std::string(a.status().message())};
    }
    LogInfo(absl::StrCat("generation ", a->generation(), ": rank ", a->rank(), " of ",
                         a->world_size(), ", from window ", a->next_window_id(), ", state from ",
                         v1::Assignment::StateSource_Name(a->state_source())));
    collective_.reset();
    absl::StatusOr<std::unique_ptr<Collective>> c =
        Collective::Connect(client_.get(), job_id_, *a, options_.collective);
    if (!c.ok()) {
      LogWarning(std::string(c.status().message()));
      after = a->generation();
      continue;
    }
    collective_ = std::move(*c);
    if (absl::Status s = SyncState(*a); !s.ok()) {
      if (IsRejoinable(s)) {
        LogWarning(absl::StrCat("state sync: ", s.message(), "; rejoining"));
        after = a->generation();
        continue;
      }
      Fail(s);
      return {1, std::string(s.message())};
    }
    absl::StatusOr<GenerationEnd> end = RunGeneration(*a);
    // Whatever ended the generation, the checkpoint in flight is finished first: the next
    // generation may restore the parameters in place, and a failed write fails the job.
    if (absl::Status written = checkpoints_->Flush(); !written.ok()) {
      if (end.ok()) {
        end = written;
      } else {
        LogError(absl::StrCat("checkpoint: ", written.message()));
      }
    }
    if (!end.ok()) {
      if (job_over_) break;
      Fail(end.status());
      return {1, std::string(end.status().message())};
    }
    if (*end == GenerationEnd::kJobDone) {
      if (absl::Status s = AwaitJobEnd(); !s.ok()) return {1, std::string(s.message())};
      break;
    }
    after = a->generation();
  }
  collective_.reset();
  absl::MutexLock lock(&mu_);
  std::string outcome =
      absl::StrCat("job ", job_id_, " ended: ", v1::JobState_Name(last_heartbeat_.job_state()));
  if (!last_heartbeat_.job_message().empty())
    absl::StrAppend(&outcome, ": ", last_heartbeat_.job_message());
  return {0, outcome};
}

}  // namespace trainstep
