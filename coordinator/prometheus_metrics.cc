#include "coordinator/prometheus_metrics.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/metrics_http.h"
#include "common/status_macros.h"
#include "common/version.h"
#include "core/hang.h"
#include "core/window_outcome.h"

namespace trainstep {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;
using prometheus::Histogram;

const Histogram::BucketBoundaries& LatencyBuckets() {
  static const Histogram::BucketBoundaries* b = new Histogram::BucketBoundaries{
      0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
  return *b;
}

// Seconds between commits: beyond LatencyBuckets' minute (large models, long windows).
const Histogram::BucketBoundaries& IntervalBuckets() {
  static const Histogram::BucketBoundaries* b = new Histogram::BucketBoundaries{
      0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800};
  return *b;
}

std::string Lower(absl::string_view s) { return absl::AsciiStrToLower(std::string(s)); }

// The reasons the step machine gives a skip or an abort: each job's series start at 0 for them.
struct ReasonSeries {
  v1::WindowOutcome outcome;
  v1::WindowReason reason;
};
constexpr ReasonSeries kReasonSeries[] = {
    {v1::SKIP, v1::WINDOW_REASON_OVERFLOW},           {v1::SKIP, v1::WINDOW_REASON_EMPTY_WINDOW},
    {v1::SKIP, v1::WINDOW_REASON_NONFINITE_LOSS},     {v1::ABORT, v1::WINDOW_REASON_DESYNC},
    {v1::ABORT, v1::WINDOW_REASON_WORKER_LOST},       {v1::SKIP, v1::WINDOW_REASON_LOSS_SPIKE},
    {v1::ABORT, v1::WINDOW_REASON_RERUN_INTERRUPTED},
};

// The `reason` label: the log's reason, lower-cased.
std::string ReasonLabel(absl::string_view reason) { return Lower(reason); }

// "forward_backward" for COMPUTE_PHASE_FORWARD_BACKWARD.
std::string PhaseLabel(v1::ComputePhase phase) {
  return Lower(absl::StripPrefix(v1::ComputePhase_Name(phase), "COMPUTE_PHASE_"));
}

// Gauges get NaN for a skipped window's norm; Prometheus accepts it, but keep the last real one.
void SetFinite(prometheus::Gauge& g, double v) {
  if (std::isfinite(v)) g.Set(v);
}

}  // namespace

PrometheusMetrics::PrometheusMetrics()
    : registry_(std::make_shared<prometheus::Registry>()),
      updates_(BuildCounter()
                   .Name("trainstep_optimizer_updates_total")
                   .Help("Committed optimizer updates")
                   .Register(*registry_)),
      skipped_(BuildCounter()
                   .Name("trainstep_windows_skipped_total")
                   .Help("Windows that ended without an update, by reason")
                   .Register(*registry_)),
      aborted_(BuildCounter()
                   .Name("trainstep_windows_aborted_total")
                   .Help("Windows aborted and retried in a new generation, by reason")
                   .Register(*registry_)),
      tokens_(BuildCounter()
                  .Name("trainstep_tokens_total")
                  .Help("Valid tokens (or samples) of committed windows")
                  .Register(*registry_)),
      rejected_(BuildCounter()
                    .Name("trainstep_stale_requests_rejected_total")
                    .Help("Worker calls refused as stale or out of protocol, by rpc and code")
                    .Register(*registry_)),
      auth_failures_(BuildCounter()
                         .Name("trainstep_rpc_auth_failures_total")
                         .Help("Calls refused for their credentials, by method and code "
                               "(unauthenticated: none or a bad one; permission_denied: a role "
                               "that does not allow it)")
                         .Register(*registry_)),
      dropped_samples_(BuildCounter()
                           .Name("trainstep_dropped_samples_total")
                           .Help("Samples left out by the epochs ended so far (batch.tail drop)")
                           .Register(*registry_)),
      reruns_(BuildCounter()
                  .Name("trainstep_window_reruns_total")
                  .Help("Windows computed again before their decision (spec.validate), by "
                        "verdict: persistent (the data or the model) or transient (a fault on "
                        "a rank, which is marked suspect)")
                  .Register(*registry_)),
      micro_step_id_(BuildGauge()
                         .Name("trainstep_micro_step_id")
                         .Help("Micro-batches of every committed or skipped window, all ranks")
                         .Register(*registry_)),
      loss_scale_(BuildGauge()
                      .Name("trainstep_loss_scale")
                      .Help("Loss scale in force after the last window (1 without a scaler)")
                      .Register(*registry_)),
      learning_rate_(BuildGauge()
                         .Name("trainstep_learning_rate")
                         .Help("Base learning rate of the last window")
                         .Register(*registry_)),
      update_tokens_(BuildGauge()
                         .Name("trainstep_update_tokens")
                         .Help("Valid tokens of the last window (N)")
                         .Register(*registry_)),
      loss_(BuildGauge()
                .Name("trainstep_loss")
                .Help("Token-weighted loss of the last committed window")
                .Register(*registry_)),
      eval_loss_(BuildGauge()
                     .Name("trainstep_eval_loss")
                     .Help("Held-out loss (spec.eval) of the latest evaluated update")
                     .Register(*registry_)),
      grad_norm_(BuildGauge()
                     .Name("trainstep_grad_norm")
                     .Help("Global L2 gradient norm of the last committed window (stage scaled: "
                           "before unscaling, with a loss scaler)")
                     .Register(*registry_)),
      rank_score_(BuildGauge()
                      .Name("trainstep_rank_score")
                      .Help("Straggler score of the job's slowest rank, 1 = as fast as the "
                            "reference (kind relative: vs the fastest rank; individual: vs its "
                            "own best); trainstep worker list names the rank")
                      .Register(*registry_)),
      workers_(
          BuildGauge().Name("trainstep_workers").Help("Workers by state").Register(*registry_)),
      world_size_(BuildGauge()
                      .Name("trainstep_world_size")
                      .Help("Ranks of the current generation")
                      .Register(*registry_)),
      waiting_for_workers_(BuildGauge()
                               .Name("trainstep_job_waiting_for_workers")
                               .Help("1 while no generation trains because workers are missing "
                                     "(below workers.min, or within workers.join_grace)")
                               .Register(*registry_)),
      generation_(BuildGauge()
                      .Name("trainstep_generation")
                      .Help("Current membership generation")
                      .Register(*registry_)),
      checkpoint_id_(BuildGauge()
                         .Name("trainstep_checkpoint_id")
                         .Help("Latest durable checkpoint id (-1 none)")
                         .Register(*registry_)),
      last_commit_(BuildGauge()
                       .Name("trainstep_last_commit_timestamp_seconds")
                       .Help("Unix time of the last committed update")
                       .Register(*registry_)),
      jobs_(BuildGauge().Name("trainstep_jobs").Help("Jobs by state").Register(*registry_)),
      job_state_(BuildGauge()
                     .Name("trainstep_job_state")
                     .Help("1 for the job's current state, 0 for the others")
                     .Register(*registry_)),
      job_start_(BuildGauge()
                     .Name("trainstep_job_start_timestamp_seconds")
                     .Help("Unix time the job started running")
                     .Register(*registry_)),
      build_info_(BuildGauge()
                      .Name("trainstep_build_info")
                      .Help("Build information (value 1)")
                      .Register(*registry_)),
      goodput_(BuildGauge()
                   .Name("trainstep_job_goodput_ratio")
                   .Help("Time committing updates at the steady pace ÷ wall time since the "
                         "job's first commit")
                   .Register(*registry_)),
      lost_seconds_(BuildGauge()
                        .Name("trainstep_job_lost_seconds")
                        .Help("Wall time since the job's first commit not spent at the steady "
                              "pace, by cause")
                        .Register(*registry_)),
      hangs_(BuildCounter()
                 .Name("trainstep_hangs_total")
                 .Help("Ranks fenced as hung (alive, stuck in a step of their own work while "
                       "their peers waited), by that step")
                 .Register(*registry_)),
      checkpoints_damaged_(BuildCounter()
                               .Name("trainstep_checkpoints_damaged_total")
                               .Help("Checkpoints a rank found damaged when it loaded them (the "
                                     "job rolled back past each)")
                               .Register(*registry_)),
      journal_writable_(BuildGauge()
                            .Name("trainstep_journal_writable")
                            .Help("1 while the journal can be written; 0 while it cannot and "
                                  "every decision is held")
                            .Register(*registry_)),
      journal_failures_(BuildCounter()
                            .Name("trainstep_journal_failures_total")
                            .Help("Times the journal could not be written (decisions held)")
                            .Register(*registry_)),
      window_duration_(BuildHistogram()
                           .Name("trainstep_window_duration_seconds")
                           .Help("First report to decision, per window")
                           .Register(*registry_)),
      barrier_wait_(BuildHistogram()
                        .Name("trainstep_barrier_wait_seconds")
                        .Help("Time a rank's barrier call waited for the others")
                        .Register(*registry_)),
      fsync_(BuildHistogram()
                 .Name("trainstep_journal_fsync_seconds")
                 .Help("Journal group-commit write+fsync latency")
                 .Register(*registry_)),
      update_interval_(BuildHistogram()
                           .Name("trainstep_update_interval_seconds")
                           .Help("Wall-clock time from one committed update to the next")
                           .Register(*registry_)) {
  build_info_.Add({{"version", TrainstepVersion()}, {"component", "coordinator"}}).Set(1);
  journal_writable_.Add({}).Set(1);
  journal_failures_.Add({});
}

absl::StatusOr<std::unique_ptr<PrometheusMetrics>> PrometheusMetrics::Start(
    const std::string& address) {
  auto m = std::make_unique<PrometheusMetrics>();
  ASSIGN_OR_RETURN(MetricsEndpoint endpoint, StartMetricsEndpoint(address, m->registry_));
  m->exposer_ = std::move(endpoint.exposer);
  m->port_ = endpoint.port;
  m->host_ = address.substr(0, address.rfind(':'));
  return m;
}

void PrometheusMetrics::SetJobGauges(const v1::Job& job) {
  const Labels l = {{"training_job", job.job_id()}};
  const v1::JobProgress& p = job.progress();
  loss_scale_.Add(l).Set(p.loss_scale());
  world_size_.Add(l).Set(p.world_size());
  waiting_for_workers_.Add(l).Set(p.waiting().empty() ? 0 : 1);
  generation_.Add(l).Set(static_cast<double>(p.generation()));
  checkpoint_id_.Add(l).Set(static_cast<double>(p.durable_checkpoint_id()));
  micro_step_id_.Add(l).Set(static_cast<double>(p.micro_step_id()));
  if (p.has_last_eval_loss()) SetFinite(eval_loss_.Add(l), p.last_eval_loss());
  if (p.has_goodput()) {
    const v1::Goodput& g = p.goodput();
    goodput_.Add(l).Set(g.ratio());
    const std::pair<const char*, double> lost[] = {{"reform", g.reform_seconds()},
                                                   {"rollback", g.rollback_seconds()},
                                                   {"skipped", g.skipped_seconds()},
                                                   {"storage", g.storage_seconds()}};
    for (const auto& [cause, seconds] : lost) {
      lost_seconds_.Add({{"training_job", job.job_id()}, {"cause", cause}}).Set(seconds);
    }
  }
  // The lowest score among the latest generation's ranks: per-rank labels would be unbounded
  // (CONVENTIONS.md). No series before a window was scored.
  for (const bool relative : {true, false}) {
    const Labels kl = {{"training_job", job.job_id()},
                       {"kind", relative ? "relative" : "individual"}};
    if (p.rank_scores().empty()) {
      if (rank_score_.Has(kl)) rank_score_.Remove(&rank_score_.Add(kl));
      continue;
    }
    double lowest = 1.0;
    for (const v1::RankScore& r : p.rank_scores()) {
      lowest = std::min(lowest, relative ? r.relative() : r.individual());
    }
    rank_score_.Add(kl).Set(lowest);
  }
}

void PrometheusMetrics::InitJobCounters(const std::string& job_id) {
  const Labels l = {{"training_job", job_id}};
  updates_.Add(l);
  tokens_.Add(l);
  dropped_samples_.Add(l);
  for (v1::RerunVerdict verdict : {v1::RERUN_VERDICT_PERSISTENT, v1::RERUN_VERDICT_TRANSIENT}) {
    reruns_.Add({{"training_job", job_id}, {"verdict", VerdictName(verdict)}});
  }
  for (const ReasonSeries& s : kReasonSeries) {
    (s.outcome == v1::SKIP ? skipped_ : aborted_)
        .Add({{"training_job", job_id}, {"reason", ReasonLabel(ReasonName(s.reason))}});
  }
  for (int p = v1::ComputePhase_MIN; p <= v1::ComputePhase_MAX; ++p) {
    const auto phase = static_cast<v1::ComputePhase>(p);
    if (IsOwnWork(phase)) hangs_.Add({{"training_job", job_id}, {"phase", PhaseLabel(phase)}});
  }
  checkpoints_damaged_.Add({{"training_job", job_id}});
}

void PrometheusMetrics::OnRecord(const v1::JournalRecord& record, const v1::Job& job) {
  const std::string& id = job.job_id();
  SetJobGauges(job);
  if (record.has_worker_lost() &&
      record.worker_lost().hung_phase() != v1::COMPUTE_PHASE_UNSPECIFIED) {
    hangs_.Add({{"training_job", id}, {"phase", PhaseLabel(record.worker_lost().hung_phase())}})
        .Increment();
  }
  if (record.has_generation_ended() && record.generation_ended().has_damaged_checkpoint_id()) {
    checkpoints_damaged_.Add({{"training_job", id}}).Increment();
  }
  if (!record.has_window_ended()) return;
  const v1::UpdateRecord& r = record.window_ended().decision().record();
  const Labels l = {{"training_job", id}};
  learning_rate_.Add(l).Set(r.learning_rate());
  update_tokens_.Add(l).Set(static_cast<double>(r.global_valid_tokens()));
  window_duration_.Add(l, LatencyBuckets()).Observe(r.window_seconds());
  if (r.has_dropped_tail()) {
    dropped_samples_.Add(l).Increment(static_cast<double>(r.dropped_tail().samples()));
  }
  if (r.has_rerun())
    reruns_.Add({{"training_job", id}, {"verdict", VerdictName(VerdictOf(r.rerun()))}}).Increment();
  const v1::WindowOutcome outcome = OutcomeOf(r);
  if (outcome == v1::COMMIT) {
    updates_.Add(l).Increment();
    tokens_.Add(l).Increment(static_cast<double>(r.global_valid_tokens()));
    SetFinite(loss_.Add(l), r.loss());
    SetFinite(grad_norm_.Add({{"training_job", id}, {"stage", "pre_clip"}}),
              r.grad_norm_pre_clip());
    SetFinite(grad_norm_.Add({{"training_job", id}, {"stage", "post_clip"}}),
              r.grad_norm_post_clip());
    if (r.has_grad_norm_scaled()) {
      SetFinite(grad_norm_.Add({{"training_job", id}, {"stage", "scaled"}}), r.grad_norm_scaled());
    }
    if (r.has_update_interval_seconds()) {
      update_interval_.Add(l, IntervalBuckets()).Observe(r.update_interval_seconds());
    }
    last_commit_.Add(l).Set(static_cast<double>(r.end_time_ms()) / 1000.0);
  } else if (outcome == v1::SKIP) {
    skipped_.Add({{"training_job", id}, {"reason", ReasonLabel(r.reason())}}).Increment();
  } else {
    aborted_.Add({{"training_job", id}, {"reason", ReasonLabel(r.reason())}}).Increment();
  }
}

void PrometheusMetrics::OnJobStates(const std::vector<v1::Job>& jobs) {
  std::map<std::string, int> by_state;
  for (int s = v1::PENDING; s <= v1::CANCELLED; ++s) {
    by_state[Lower(v1::JobState_Name(static_cast<v1::JobState>(s)))] = 0;
  }
  absl::MutexLock lock(&mu_);
  for (const v1::Job& job : jobs) {
    ++by_state[Lower(v1::JobState_Name(job.state()))];
    SetJobGauges(job);
    const Labels l = {{"training_job", job.job_id()}};
    for (int s = v1::PENDING; s <= v1::CANCELLED; ++s) {
      job_state_
          .Add({{"training_job", job.job_id()},
                {"state", Lower(v1::JobState_Name(static_cast<v1::JobState>(s)))}})
          .Set(job.state() == s ? 1 : 0);
    }
    if (job.start_time_ms() > 0) {
      job_start_.Add(l).Set(static_cast<double>(job.start_time_ms()) / 1000.0);
    }
    // A job first seen here is new, or was recovered from the journal: catch its counters up.
    if (seen_jobs_.insert(job.job_id()).second) {
      InitJobCounters(job.job_id());
      updates_.Add(l).Increment(static_cast<double>(job.progress().windows_committed()));
      tokens_.Add(l).Increment(static_cast<double>(job.progress().cumulative_tokens()));
      dropped_samples_.Add(l).Increment(static_cast<double>(job.progress().dropped_samples()));
      const int64_t transient = job.progress().reruns_transient();
      reruns_
          .Add({{"training_job", job.job_id()},
                {"verdict", VerdictName(v1::RERUN_VERDICT_TRANSIENT)}})
          .Increment(static_cast<double>(transient));
      reruns_
          .Add({{"training_job", job.job_id()},
                {"verdict", VerdictName(v1::RERUN_VERDICT_PERSISTENT)}})
          .Increment(static_cast<double>(job.progress().reruns() - transient));
    }
  }
  for (const auto& [state, n] : by_state) jobs_.Add({{"state", state}}).Set(n);
}

void PrometheusMetrics::OnWorkers(const std::string& job_id,
                                  const std::vector<v1::WorkerInfo>& workers) {
  std::map<std::string, int> by_state;
  for (int s = v1::REGISTERED; s <= v1::LOST; ++s) {
    by_state[Lower(v1::WorkerState_Name(static_cast<v1::WorkerState>(s)))] = 0;
  }
  for (const v1::WorkerInfo& w : workers) ++by_state[Lower(v1::WorkerState_Name(w.state()))];
  for (const auto& [state, n] : by_state) {
    workers_.Add({{"training_job", job_id}, {"state", state}}).Set(n);
  }
}

void PrometheusMetrics::OnJournalFsync(double seconds) {
  fsync_.Add({}, LatencyBuckets()).Observe(seconds);
}

void PrometheusMetrics::OnJournalWritable(bool writable) {
  journal_writable_.Add({}).Set(writable ? 1 : 0);
  if (!writable) journal_failures_.Add({}).Increment();
}

void PrometheusMetrics::OnRejected(absl::string_view rpc, absl::string_view reason) {
  rejected_.Add({{"rpc", std::string(rpc)}, {"reason", Lower(reason)}}).Increment();
}

void PrometheusMetrics::OnAuthFailure(absl::string_view method, absl::string_view code) {
  auth_failures_.Add({{"method", std::string(method)}, {"code", std::string(code)}}).Increment();
}

void PrometheusMetrics::OnBarrierWait(absl::string_view phase, double seconds) {
  barrier_wait_.Add({{"phase", std::string(phase)}}, LatencyBuckets()).Observe(seconds);
}

}  // namespace trainstep
