// Test helpers for the coordinator's pure state machine: resolved specs built from JSON
// through the one real resolver, and SimulatedRanks, which plays W workers against a
// JobRegistry/StepMachine with a hand-advanced clock (no threads, no sockets, no sleeps).
#ifndef TRAINSTEP_TESTS_UNIT_COORDINATOR_MACHINE_TEST_UTIL_H_
#define TRAINSTEP_TESTS_UNIT_COORDINATOR_MACHINE_TEST_UTIL_H_

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "coordinator/job_registry.h"
#include "coordinator/step_machine.h"
#include "core/spec.h"
#include "gtest/gtest.h"

namespace trainstep {
namespace testing_util {

// The knobs the coordinator reads; everything else stays at the resolver's defaults.
struct SpecOptions {
  int workers = 2;
  std::optional<int> min_workers;  // workers.min
  std::string join_grace;          // workers.join_grace ("5s"), "" = default
  int micro_batch_size = 1;
  int accumulation_steps = 2;
  std::string tail = "dynamic";    // dynamic | drop
  std::string precision = "fp32";  // fp32 | bf16 | fp16
  std::string loss_scaler;         // JSON object, "" = resolver defaults
  std::optional<int64_t> max_updates;
  std::optional<int64_t> epochs;
  std::string checkpoint_dir;  // "" = checkpoints off
  std::optional<int64_t> every_updates;
  std::optional<double> max_grad_norm;
  std::string schedule;                      // JSON object, "" = constant
  double lr = 0.1;                           // sgd
  std::optional<int64_t> eval_every;         // set: spec.eval with this every_updates
  std::string stragglers;                    // JSON object, "" = resolver defaults
  std::string validate;                      // JSON object, "" = resolver defaults (off)
  std::string model = R"({"tiny_gpt":{}})";  // spec.model, a JSON object
};

inline std::string SpecJson(const SpecOptions& o) {
  std::string json = absl::StrCat(
      R"({"name":"t","model":)", o.model, R"(,"data":{"text":{"paths":["/data"]}},)",
      R"("batch":{"micro_batch_size":)", o.micro_batch_size, R"(,"accumulation_steps":)",
      o.accumulation_steps, R"(,"tail":")", o.tail, R"("},)", R"("precision":")", o.precision,
      R"(","optimizer":{"sgd":{"lr":)", o.lr, "}},", R"("workers":{"count":)", o.workers);
  if (o.min_workers) absl::StrAppend(&json, R"(,"min":)", *o.min_workers);
  if (!o.join_grace.empty()) absl::StrAppend(&json, R"(,"join_grace":")", o.join_grace, "\"");
  absl::StrAppend(&json, "}");
  if (!o.loss_scaler.empty()) absl::StrAppend(&json, R"(,"loss_scaler":)", o.loss_scaler);
  if (!o.schedule.empty()) absl::StrAppend(&json, R"(,"schedule":)", o.schedule);
  if (o.max_grad_norm)
    absl::StrAppend(&json, R"(,"clip":{"max_grad_norm":)", *o.max_grad_norm, "}");
  std::string stop;
  if (o.max_updates) absl::StrAppend(&stop, R"("max_updates":)", *o.max_updates);
  if (o.epochs) absl::StrAppend(&stop, stop.empty() ? "" : ",", R"("epochs":)", *o.epochs);
  if (!stop.empty()) absl::StrAppend(&json, R"(,"stop":{)", stop, "}");
  if (o.eval_every) {
    absl::StrAppend(&json, R"(,"eval":{"data":{"text":{"paths":["/held-out"]}},"every_updates":)",
                    *o.eval_every, "}");
  }
  if (!o.stragglers.empty()) absl::StrAppend(&json, R"(,"stragglers":)", o.stragglers);
  if (!o.validate.empty()) absl::StrAppend(&json, R"(,"validate":)", o.validate);
  if (!o.checkpoint_dir.empty()) {
    absl::StrAppend(&json, R"(,"checkpoint":{"dir":")", o.checkpoint_dir, "\"");
    if (o.every_updates) absl::StrAppend(&json, R"(,"every_updates":)", *o.every_updates);
    absl::StrAppend(&json, "}");
  }
  absl::StrAppend(&json, "}");
  return json;
}

inline v1::JobSpec ResolvedSpec(const SpecOptions& o) {
  const std::string json = SpecJson(o);
  absl::StatusOr<v1::JobSpec> spec = ParseAndResolveJobSpec(json);
  if (!spec.ok()) {
    ADD_FAILURE() << spec.status() << "\n" << json;
    return {};
  }
  return *spec;
}

// What one rank reports at the end of a window.
struct RankReport {
  double loss_sum = 10.0;
  int64_t units = 10;
  bool found_inf = false;
  double grad_norm = 0.5;
  int64_t micro_steps = 2;
  int64_t allreduce_calls = 1;
  std::optional<double> grad_norm_scaled;  // sent only when set (a loss scaler is on)
  std::optional<double> compute_seconds;   // the phases, sent only when set
  int32_t run = 0;                         // 0: the first; 2: a re-run
  std::optional<uint64_t> grad_checksum;   // spec.validate's local gradient checksum
  std::vector<std::pair<int64_t, double>> sample_losses;  // a re-run's worst samples
};

inline std::vector<RankReport> Reports(int world, RankReport r = {}) {
  return std::vector<RankReport>(world, r);
}

inline int64_t TotalUnits(const std::vector<RankReport>& reports) {
  int64_t n = 0;
  for (const RankReport& r : reports) n += r.units;
  return n;
}

// W ranks driven by hand against one job in a JobRegistry. Every journal record the
// registry produces is drained into records() after each call.
class SimulatedRanks {
 public:
  explicit SimulatedRanks(const v1::JobSpec& spec, MachineOptions options = {},
                          absl::Time start = absl::FromUnixSeconds(1'700'000'000))
      : options_(options), registry_(options), now_(start) {
    v1::SubmitJobRequest req;
    *req.mutable_spec() = spec;
    absl::StatusOr<v1::Job> job = registry_.Submit(req, now_);
    if (!job.ok()) {
      ADD_FAILURE() << job.status();
      return;
    }
    job_id_ = job->job_id();
    Drain();
  }

  JobRegistry& registry() { return registry_; }
  StepMachine& machine() { return **registry_.Machine(job_id_); }
  const std::string& job_id() const { return job_id_; }
  const MachineOptions& options() const { return options_; }
  absl::Time now() const { return now_; }
  void Advance(absl::Duration d) { now_ += d; }
  v1::Job job() { return machine().Job(); }
  v1::JobState state() { return job().state(); }
  const v1::JobProgress progress() { return job().progress(); }

  // Moves the registry's new records into records() and returns them.
  std::vector<v1::JournalRecord> Drain() {
    std::vector<v1::JournalRecord> fresh = registry_.TakeRecords();
    records_.insert(records_.end(), fresh.begin(), fresh.end());
    return fresh;
  }
  const std::vector<v1::JournalRecord>& records() const { return records_; }

  v1::DatasetInfo dataset() const {
    v1::DatasetInfo d;
    d.set_samples(samples_);
    d.set_fingerprint("fingerprint-1");
    return d;
  }
  void set_samples(int64_t samples) { samples_ = samples; }

  std::string AddWorker() {
    v1::RegisterWorkerRequest req;
    req.set_job_id(job_id_);
    req.set_name(absl::StrCat("worker-", ++added_));
    req.set_host(absl::StrCat("host-", added_));
    absl::StatusOr<v1::RegisterWorkerResponse> resp = registry_.RegisterWorker(req, now_);
    Drain();
    if (!resp.ok()) {
      ADD_FAILURE() << resp.status();
      return "";
    }
    return resp->worker_id();
  }

  // A heartbeat that carries the dataset report (ignored once accepted).
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const std::string& worker_id,
                                                  std::optional<v1::DatasetInfo> dataset = {}) {
    v1::HeartbeatRequest req;
    req.set_job_id(job_id_);
    req.set_worker_id(worker_id);
    *req.mutable_dataset() = dataset.value_or(this->dataset());
    req.set_applied_update_id(progress().optimizer_update_id());
    absl::StatusOr<v1::HeartbeatResponse> resp = machine().Heartbeat(req, now_);
    Drain();
    return resp;
  }

  // A heartbeat saying what the worker's replica holds, and whether it waits for a generation
  // after `idle_after` (unset: it is still busy in its generation).
  absl::StatusOr<v1::HeartbeatResponse> HeartbeatAs(const std::string& worker_id,
                                                    int64_t applied_update_id,
                                                    std::optional<int64_t> idle_after = {}) {
    v1::HeartbeatRequest req;
    req.set_job_id(job_id_);
    req.set_worker_id(worker_id);
    *req.mutable_dataset() = dataset();
    req.set_applied_update_id(applied_update_id);
    if (idle_after.has_value()) req.set_idle_after_generation(*idle_after);
    absl::StatusOr<v1::HeartbeatResponse> resp = machine().Heartbeat(req, now_);
    Drain();
    return resp;
  }

  // A heartbeat saying its compute thread has been in `phase` for `in_phase`.
  absl::StatusOr<v1::HeartbeatResponse> HeartbeatInPhase(const std::string& worker_id,
                                                         v1::ComputePhase phase,
                                                         absl::Duration in_phase) {
    v1::HeartbeatRequest req;
    req.set_job_id(job_id_);
    req.set_worker_id(worker_id);
    *req.mutable_dataset() = dataset();
    req.set_applied_update_id(progress().optimizer_update_id());
    req.set_phase(phase);
    req.set_phase_ms(absl::ToInt64Milliseconds(in_phase));
    absl::StatusOr<v1::HeartbeatResponse> resp = machine().Heartbeat(req, now_);
    Drain();
    return resp;
  }

  // Generations formed by the records since `from` (an index into records()).
  std::vector<v1::GenerationFormed> FormedSince(size_t from) const {
    std::vector<v1::GenerationFormed> out;
    for (size_t i = from; i < records_.size(); ++i) {
      if (records_[i].has_generation_formed()) out.push_back(records_[i].generation_formed());
    }
    return out;
  }

  // Registers `count` workers and reports the dataset from each one.
  std::vector<std::string> Start(int count) {
    std::vector<std::string> ids;
    for (int i = 0; i < count; ++i) ids.push_back(AddWorker());
    for (const std::string& id : ids) {
      absl::StatusOr<v1::HeartbeatResponse> r = Heartbeat(id);
      EXPECT_TRUE(r.ok()) << r.status();
    }
    return ids;
  }

  // Renews the lease of every live worker except `skip`.
  void HeartbeatAllExcept(const std::vector<std::string>& skip) {
    for (const v1::WorkerInfo& w : machine().Workers()) {
      if (w.state() == v1::LOST) continue;
      if (std::find(skip.begin(), skip.end(), w.worker_id()) != skip.end()) continue;
      absl::StatusOr<v1::HeartbeatResponse> r = Heartbeat(w.worker_id());
      EXPECT_TRUE(r.ok()) << r.status();
    }
  }

  void Tick() {
    machine().Tick(now_);
    Drain();
  }

  // Lets the leases of `lost` expire while everyone else heartbeats, then ticks.
  void Lose(const std::vector<std::string>& lost) {
    Advance(options_.worker_lease / 2);
    HeartbeatAllExcept(lost);
    Advance(options_.worker_lease / 2 + absl::Milliseconds(1));
    Tick();
  }

  // The members of the current generation, by rank.
  std::vector<std::string> Ranks() {
    std::vector<v1::WorkerInfo> active;
    for (const v1::WorkerInfo& w : machine().Workers()) {
      if (w.state() == v1::ACTIVE) active.push_back(w);
    }
    std::sort(active.begin(), active.end(),
              [](const v1::WorkerInfo& a, const v1::WorkerInfo& b) { return a.rank() < b.rank(); });
    std::vector<std::string> out;
    for (const v1::WorkerInfo& w : active) out.push_back(w.worker_id());
    return out;
  }
  int64_t generation() { return progress().generation(); }
  int64_t next_window() { return progress().window_id() + 1; }

  v1::BeginWindowRequest BeginRequest(int rank, int64_t window, int64_t units) {
    v1::BeginWindowRequest req;
    req.set_job_id(job_id_);
    req.set_worker_id(Ranks().at(rank));
    req.set_generation(generation());
    req.set_window_id(window);
    req.set_rank(rank);
    req.set_valid_units(units);
    return req;
  }
  v1::CompleteWindowRequest CompleteRequest(int rank, int64_t window, const RankReport& r) {
    v1::CompleteWindowRequest req;
    req.set_job_id(job_id_);
    req.set_worker_id(Ranks().at(rank));
    req.set_generation(generation());
    req.set_window_id(window);
    req.set_rank(rank);
    req.set_loss_sum(r.loss_sum);
    req.set_valid_units(r.units);
    req.set_found_inf(r.found_inf);
    req.set_grad_norm(r.grad_norm);
    req.set_micro_steps(r.micro_steps);
    req.set_allreduce_calls(r.allreduce_calls);
    if (r.grad_norm_scaled.has_value()) req.set_grad_norm_scaled(*r.grad_norm_scaled);
    if (r.compute_seconds.has_value()) {
      req.mutable_phases()->set_compute_seconds(*r.compute_seconds);
    }
    if (r.run != 0) req.set_run(r.run);
    if (r.grad_checksum.has_value()) req.set_grad_checksum(*r.grad_checksum);
    for (const auto& [id, loss] : r.sample_losses) {
      v1::SampleLoss* s = req.add_sample_losses();
      s->set_sample_id(id);
      s->set_loss(loss);
    }
    return req;
  }

  absl::StatusOr<Answer<v1::BeginWindowResponse>> Begin(const v1::BeginWindowRequest& req) {
    auto a = machine().BeginWindow(req, now_);
    Drain();
    return a;
  }
  absl::StatusOr<Answer<v1::BeginWindowResponse>> Begin(int rank, int64_t window, int64_t units) {
    return Begin(BeginRequest(rank, window, units));
  }
  absl::StatusOr<Answer<v1::CompleteWindowResponse>> Complete(
      const v1::CompleteWindowRequest& req) {
    auto a = machine().CompleteWindow(req, now_);
    Drain();
    return a;
  }
  absl::StatusOr<Answer<v1::CompleteWindowResponse>> Complete(int rank, int64_t window,
                                                              const RankReport& r) {
    return Complete(CompleteRequest(rank, window, r));
  }

  // Every rank begins `window`; only the last call may (and must) find the barrier ready.
  // Returns rank 0's repeated call, which must give the same answer as the last rank's.
  v1::BeginWindowResponse BeginAll(int64_t window, const std::vector<int64_t>& units) {
    const int world = static_cast<int>(units.size());
    v1::BeginWindowResponse last;
    for (int rank = 0; rank < world; ++rank) {
      auto a = Begin(rank, window, units[rank]);
      EXPECT_TRUE(a.ok()) << a.status();
      if (!a.ok()) return {};
      EXPECT_EQ(a->ready, rank == world - 1) << "rank " << rank << " window " << window;
      last = a->response;
    }
    return last;
  }

  // Every rank completes `window`; the last call must decide it. Returns the decision.
  v1::WindowDecision CompleteAll(int64_t window, const std::vector<RankReport>& reports) {
    const int world = static_cast<int>(reports.size());
    v1::WindowDecision decision;
    for (int rank = 0; rank < world; ++rank) {
      auto a = Complete(rank, window, reports[rank]);
      EXPECT_TRUE(a.ok()) << a.status();
      if (!a.ok()) return {};
      EXPECT_EQ(a->ready, rank == world - 1) << "rank " << rank << " window " << window;
      decision = a->response.decision();
    }
    return decision;
  }

  // spec.validate: every rank completes `window` with `first`; the last call must ask for a
  // re-run (no decision), and so must a repeated first-run report; then every rank reports
  // `second` (run 2) and the last call decides. Returns the decision.
  v1::WindowDecision CompleteWithRerun(int64_t window, const std::vector<RankReport>& first,
                                       std::vector<RankReport> second) {
    const int world = static_cast<int>(first.size());
    for (int rank = 0; rank < world; ++rank) {
      auto a = Complete(rank, window, first[rank]);
      EXPECT_TRUE(a.ok()) << a.status();
      if (!a.ok()) return {};
      EXPECT_EQ(a->ready, rank == world - 1) << "rank " << rank;
      if (a->ready) {
        EXPECT_EQ(a->response.rerun(), 2);
        EXPECT_FALSE(a->response.has_decision()) << "decided a window it should re-run";
      }
    }
    auto again = Complete(0, window, first[0]);  // rank 0 polls its first run again
    EXPECT_TRUE(again.ok() && again->ready && again->response.rerun() == 2) << again.status();
    for (RankReport& r : second) r.run = 2;
    return CompleteAll(window, second);
  }

  // The next window, begun and completed by every rank of the current generation.
  v1::WindowDecision RunWindow(const std::vector<RankReport>& reports) {
    const int64_t window = next_window();
    std::vector<int64_t> units;
    for (const RankReport& r : reports) units.push_back(r.units);
    BeginAll(window, units);
    return CompleteAll(window, reports);
  }
  v1::WindowDecision RunWindow(RankReport r = {}) {
    return RunWindow(Reports(static_cast<int>(Ranks().size()), r));
  }

  // Rank `rank` of the current generation reports its held-out loss for `update_id`.
  absl::StatusOr<Answer<v1::ReportEvalResponse>> Eval(int rank, int64_t update_id, double loss_sum,
                                                      int64_t units) {
    v1::ReportEvalRequest req;
    req.set_job_id(job_id_);
    req.set_worker_id(Ranks().at(rank));
    req.set_generation(generation());
    req.set_rank(rank);
    req.set_optimizer_update_id(update_id);
    req.set_loss_sum(loss_sum);
    req.set_valid_units(units);
    return Eval(req);
  }
  absl::StatusOr<Answer<v1::ReportEvalResponse>> Eval(const v1::ReportEvalRequest& req) {
    auto a = machine().ReportEval(req, now_);
    Drain();
    return a;
  }

  // `error`: rank 0 reports it could not write the checkpoint.
  absl::Status Ack(int64_t checkpoint_id, int64_t update_id, std::string worker = "",
                   std::string error = "") {
    v1::AckCheckpointRequest req;
    req.set_job_id(job_id_);
    req.set_worker_id(worker.empty() ? Ranks().at(0) : worker);
    req.set_checkpoint_id(checkpoint_id);
    req.set_optimizer_update_id(update_id);
    if (error.empty()) req.set_path(absl::StrCat("/ckpt/ckpt-", checkpoint_id));
    req.set_error(error);
    absl::Status s = machine().AckCheckpoint(req, now_);
    Drain();
    return s;
  }

 private:
  MachineOptions options_;
  JobRegistry registry_;
  absl::Time now_;
  std::string job_id_;
  std::vector<v1::JournalRecord> records_;
  int64_t samples_ = 1'000'000;
  int added_ = 0;
};

}  // namespace testing_util
}  // namespace trainstep

#endif  // TRAINSTEP_TESTS_UNIT_COORDINATOR_MACHINE_TEST_UTIL_H_
