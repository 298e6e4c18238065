#include "tests/integration/simulated_worker.h"

#include <atomic>
#include <chrono>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace trainstep::testing {
namespace {

// `crashed`: a crashed worker stops waiting at its next retry (a coordinator that went away
// would otherwise keep it retrying for give_up_after).
WorkerClientOptions ClientOptions(const std::atomic<bool>* crashed) {
  WorkerClientOptions o;
  o.rpc_timeout = absl::Seconds(5);
  o.barrier_poll = absl::Seconds(5);
  o.give_up_after = absl::Seconds(60);
  o.keep_waiting = [crashed] { return !crashed->load(); };
  return o;
}

void Nap(absl::Duration d) {
  std::this_thread::sleep_for(std::chrono::microseconds(absl::ToInt64Microseconds(d)));
}

}  // namespace

SimulatedWorker::SimulatedWorker(const std::string& address, std::string job_id,
                                 int64_t dataset_samples, ReportFn report)
    : job_id_(std::move(job_id)),
      dataset_samples_(dataset_samples),
      report_(std::move(report)),
      client_(MakeChannel(address), ClientOptions(&crashed_)) {}

SimulatedWorker::~SimulatedWorker() { StopHeartbeats(); }

void SimulatedWorker::StopHeartbeats() {
  if (!stop_heartbeats_.HasBeenNotified()) stop_heartbeats_.Notify();
  if (heartbeats_.joinable()) heartbeats_.join();
}

absl::Status SimulatedWorker::Register(const std::string& name) {
  v1::RegisterWorkerRequest req;
  req.set_job_id(job_id_);
  req.set_name(name);
  req.set_host("127.0.0.1");
  req.set_request_id(absl::StrCat(job_id_, "/", name));
  absl::StatusOr<v1::RegisterWorkerResponse> r = client_.RegisterWorker(req);
  if (!r.ok()) return r.status();
  worker_id_ = r->worker_id();
  heartbeat_every_ = absl::Milliseconds(std::max<int64_t>(10, r->heartbeat_interval_ms()));
  heartbeats_ = std::thread([this] { HeartbeatLoop(); });
  return absl::OkStatus();
}

v1::HeartbeatRequest SimulatedWorker::HeartbeatRequest() const {
  v1::HeartbeatRequest req;
  req.set_job_id(job_id_);
  req.set_worker_id(worker_id_);
  req.set_applied_update_id(applied_update_);
  req.mutable_dataset()->set_samples(dataset_samples_);
  req.mutable_dataset()->set_fingerprint("sim");
  return req;
}

void SimulatedWorker::HeartbeatLoop() {
  while (!stop_heartbeats_.HasBeenNotified() && !crashed_) {
    const v1::HeartbeatRequest req = HeartbeatRequest();
    (void)client_.Heartbeat(req);
    stop_heartbeats_.WaitForNotificationWithTimeout(heartbeat_every_);
  }
}

absl::StatusOr<v1::Assignment> SimulatedWorker::AwaitAssignment(int64_t after_generation) {
  const absl::Time give_up = absl::Now() + absl::Seconds(60);
  while (absl::Now() < give_up) {
    if (crashed_) return absl::CancelledError("crashed");
    const v1::HeartbeatRequest req = HeartbeatRequest();
    absl::StatusOr<v1::HeartbeatResponse> r = client_.Heartbeat(req);
    if (r.ok()) {
      if (r->job_state() != v1::PENDING && r->job_state() != v1::RUNNING) {
        return absl::FailedPreconditionError(absl::StrCat("job ended: ", r->job_message()));
      }
      if (r->assigned() && r->assignment().generation() > after_generation) {
        return r->assignment();
      }
    } else if (r.status().code() != absl::StatusCode::kUnavailable) {
      return r.status();
    }
    Nap(absl::Milliseconds(5));
  }
  return absl::DeadlineExceededError("no assignment within 60 s");
}

absl::Status SimulatedWorker::AckPending(const v1::Assignment& a) {
  if (a.rank() != 0 || !a.has_pending_checkpoint_id()) return absl::OkStatus();
  v1::AckCheckpointRequest ack;
  ack.set_job_id(job_id_);
  ack.set_worker_id(worker_id_);
  ack.set_checkpoint_id(a.pending_checkpoint_id());
  ack.set_optimizer_update_id(a.optimizer_update_id());
  ack.set_path(absl::StrCat("sim://ckpt-", a.pending_checkpoint_id()));
  return client_.AckCheckpoint(ack);
}

absl::Status SimulatedWorker::Evaluate(const v1::Assignment& a, int64_t update_id) {
  // Rank r: 5 + r units at loss 1 / (1 + update): the global eval loss is 1 / (1 + update).
  v1::ReportEvalRequest req;
  req.set_job_id(job_id_);
  req.set_worker_id(worker_id_);
  req.set_generation(a.generation());
  req.set_rank(a.rank());
  req.set_optimizer_update_id(update_id);
  req.set_valid_units(5 + a.rank());
  req.set_loss_sum(static_cast<double>(req.valid_units()) / static_cast<double>(1 + update_id));
  return client_.ReportEval(req).status();
}

v1::BeginWindowRequest SimulatedWorker::BeginRequest(const v1::Assignment& a, int64_t window,
                                                     int64_t units) const {
  v1::BeginWindowRequest begin;
  begin.set_job_id(job_id_);
  begin.set_worker_id(worker_id_);
  begin.set_generation(a.generation());
  begin.set_window_id(window);
  begin.set_rank(a.rank());
  begin.set_valid_units(units);
  return begin;
}

absl::Status SimulatedWorker::Run() {
  absl::StatusOr<v1::Assignment> a = AwaitAssignment(0);
  if (!a.ok()) return a.status();
  if (absl::Status s = AckPending(*a); !s.ok()) return s;
  if (a->has_pending_eval_update_id()) {
    if (absl::Status s = Evaluate(*a, a->pending_eval_update_id()); !s.ok()) return s;
  }
  int64_t window = a->next_window_id();
  // Window `window`'s begin report and answer when they came with the previous decision.
  std::optional<SimReport> next_report;
  std::optional<v1::BeginWindowResponse> next_answer;
  while (!crashed_) {
    const absl::Time window_start = absl::Now();
    const SimReport rep = next_report.has_value() ? *next_report : report_(window, a->rank());
    next_report.reset();
    absl::StatusOr<v1::BeginWindowResponse> b = absl::UnknownError("not sent");
    if (next_answer.has_value()) {
      b = *std::exchange(next_answer, std::nullopt);
    } else {
      ++plain_begins_;
      b = client_.BeginWindow(BeginRequest(*a, window, rep.units));
    }
    if (crashed_) break;
    v1::WindowDecision decision;
    if (!b.ok()) {
      if (b.status().code() != absl::StatusCode::kAborted) return b.status();
      decision.set_outcome(v1::ABORT);
    } else if (b->has_decision()) {
      decision = b->decision();
    } else {
      v1::CompleteWindowRequest c;
      c.set_job_id(job_id_);
      c.set_worker_id(worker_id_);
      c.set_generation(a->generation());
      c.set_window_id(window);
      c.set_rank(a->rank());
      c.set_valid_units(rep.units);
      c.set_loss_sum(rep.loss_sum);
      c.set_grad_norm(rep.grad_norm);
      if (rep.scaled_norm) c.set_grad_norm_scaled(rep.grad_norm * b->loss_scale());
      c.set_found_inf(rep.found_inf);
      c.set_micro_steps(1);
      c.set_allreduce_calls(1);
      if (rep.compute_seconds > 0) c.mutable_phases()->set_compute_seconds(rep.compute_seconds);
      if (pipeline_begin_) {
        // Whether a next window exists is the coordinator's to say: no answer comes if not.
        next_report = report_(window + 1, a->rank());
        *c.mutable_next() = BeginRequest(*a, window + 1, next_report->units);
      }
      absl::StatusOr<v1::CompleteWindowResponse> d = client_.CompleteWindow(c);
      if (crashed_) break;
      if (!d.ok()) {
        if (d.status().code() != absl::StatusCode::kAborted) return d.status();
        decision.set_outcome(v1::ABORT);
      } else {
        decision = d->decision();
        if (d->has_next()) next_answer = d->next();
      }
    }
    if (decision.outcome() == v1::ABORT) {
      // Nothing applied; rejoin and retry from the window the new generation names.
      next_report.reset();
      next_answer.reset();
      a = AwaitAssignment(a->generation());
      if (!a.ok()) return a.status();
      if (absl::Status s = AckPending(*a); !s.ok()) return s;
      window = a->next_window_id();
      continue;
    }
    {
      absl::MutexLock lock(&mu_);
      decisions_.push_back(decision);
      window_seconds_.push_back(absl::ToDoubleSeconds(absl::Now() - window_start));
    }
    applied_update_ = decision.optimizer_update_id();
    if (decision.run_eval()) {
      if (absl::Status s = Evaluate(*a, decision.optimizer_update_id()); !s.ok()) return s;
    }
    if (decision.write_checkpoint() && a->rank() == 0) {
      v1::AckCheckpointRequest ack;
      ack.set_job_id(job_id_);
      ack.set_worker_id(worker_id_);
      ack.set_checkpoint_id(decision.checkpoint_id());
      ack.set_optimizer_update_id(decision.optimizer_update_id());
      ack.set_path(absl::StrCat("sim://ckpt-", decision.checkpoint_id()));
      absl::Status s = client_.AckCheckpoint(ack);
      if (!s.ok()) return s;
    }
    if (decision.job_done()) return absl::OkStatus();
    ++window;
  }
  return absl::CancelledError("crashed");
}

std::vector<double> SimulatedWorker::window_seconds() const {
  absl::MutexLock lock(&mu_);
  return window_seconds_;
}

std::vector<v1::WindowDecision> SimulatedWorker::decisions() const {
  absl::MutexLock lock(&mu_);
  return decisions_;
}

}  // namespace trainstep::testing
