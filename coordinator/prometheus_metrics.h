// The coordinator's /metrics endpoint (prometheus-cpp). Series follow CONVENTIONS.md:
// prefix trainstep_, base units, label training_job (never per rank or per window).
#ifndef TRAINSTEP_COORDINATOR_PROMETHEUS_METRICS_H_
#define TRAINSTEP_COORDINATOR_PROMETHEUS_METRICS_H_

#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <map>
#include <memory>
#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/metrics.h"

namespace trainstep {

class PrometheusMetrics : public CoordinatorMetrics {
 public:
  // Serves /metrics on `address` (host:port, port 0 = any free one).
  static absl::StatusOr<std::unique_ptr<PrometheusMetrics>> Start(const std::string& address);
  // Without an HTTP endpoint (tests read the registry).
  PrometheusMetrics();

  int port() const { return port_; }
  const std::string& host() const { return host_; }
  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }

  void OnRecord(const v1::JournalRecord& record, const v1::Job& job) override;
  void OnJobStates(const std::vector<v1::Job>& jobs) override;
  void OnWorkers(const std::string& job_id, const std::vector<v1::WorkerInfo>& workers) override;
  void OnJournalFsync(double seconds) override;
  void OnJournalWritable(bool writable) override;
  void OnRejected(absl::string_view rpc, absl::string_view reason) override;
  void OnBarrierWait(absl::string_view phase, double seconds) override;
  void OnAuthFailure(absl::string_view method, absl::string_view code) override;

 private:
  using Labels = std::map<std::string, std::string>;
  void SetJobGauges(const v1::Job& job);
  // Creates a new job's counters at 0 for every known reason: an absent series would hide
  // the first increment from rate() and leave ratios empty instead of 0.
  void InitJobCounters(const std::string& job_id);

  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::string host_;
  int port_ = 0;

  prometheus::Family<prometheus::Counter>& updates_;
  prometheus::Family<prometheus::Counter>& skipped_;
  prometheus::Family<prometheus::Counter>& aborted_;
  prometheus::Family<prometheus::Counter>& tokens_;
  prometheus::Family<prometheus::Counter>& rejected_;
  prometheus::Family<prometheus::Counter>& auth_failures_;
  prometheus::Family<prometheus::Counter>& dropped_samples_;
  prometheus::Family<prometheus::Counter>& reruns_;  // by verdict (spec.validate)
  prometheus::Family<prometheus::Gauge>& micro_step_id_;
  prometheus::Family<prometheus::Gauge>& loss_scale_;
  prometheus::Family<prometheus::Gauge>& learning_rate_;
  prometheus::Family<prometheus::Gauge>& update_tokens_;
  prometheus::Family<prometheus::Gauge>& loss_;
  prometheus::Family<prometheus::Gauge>& eval_loss_;
  prometheus::Family<prometheus::Gauge>& grad_norm_;
  prometheus::Family<prometheus::Gauge>& rank_score_;
  prometheus::Family<prometheus::Gauge>& workers_;
  prometheus::Family<prometheus::Gauge>& world_size_;
  prometheus::Family<prometheus::Gauge>& waiting_for_workers_;
  prometheus::Family<prometheus::Gauge>& generation_;
  prometheus::Family<prometheus::Gauge>& checkpoint_id_;
  prometheus::Family<prometheus::Gauge>& last_commit_;
  prometheus::Family<prometheus::Gauge>& jobs_;
  prometheus::Family<prometheus::Gauge>& job_state_;
  prometheus::Family<prometheus::Gauge>& job_start_;
  prometheus::Family<prometheus::Gauge>& build_info_;
  prometheus::Family<prometheus::Gauge>& goodput_;
  prometheus::Family<prometheus::Gauge>& lost_seconds_;  // by cause
  prometheus::Family<prometheus::Counter>& hangs_;       // by phase (spec.hang)
  prometheus::Family<prometheus::Counter>& checkpoints_damaged_;
  prometheus::Family<prometheus::Gauge>& journal_writable_;
  prometheus::Family<prometheus::Counter>& journal_failures_;
  prometheus::Family<prometheus::Histogram>& window_duration_;
  prometheus::Family<prometheus::Histogram>& barrier_wait_;
  prometheus::Family<prometheus::Histogram>& fsync_;
  prometheus::Family<prometheus::Histogram>& update_interval_;

  absl::Mutex mu_;  // prometheus-cpp metrics are thread-safe; this guards seen_jobs_
  std::set<std::string> seen_jobs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace trainstep

#endif  // TRAINSTEP_COORDINATOR_PROMETHEUS_METRICS_H_
