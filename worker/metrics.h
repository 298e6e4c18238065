// The worker's /metrics (prometheus-cpp): micro-steps, all-reduce calls and bytes, time per
// phase, tokens. Label training_job; nothing per window.
#ifndef TRAINSTEP_WORKER_METRICS_H_
#define TRAINSTEP_WORKER_METRICS_H_

#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace trainstep {

class WorkerMetrics {
 public:
  // Serves /metrics on `address` (host:port; port 0 = a free one).
  static absl::StatusOr<std::unique_ptr<WorkerMetrics>> Start(const std::string& address);
  WorkerMetrics();

  int port() const { return port_; }
  void SetJob(const std::string& job_id);
  void AddMicroSteps(int64_t n);
  void AddAllReduce(int64_t calls, int64_t bytes);
  void AddTokens(int64_t n);
  void AddCheckpointFailure();  // a checkpoint that could not be written
  // phase: forward | backward | allreduce (the wait after backward) |
  // allreduce_overlapped (first bucket launched → backward returned) | optimizer
  void ObservePhase(absl::string_view phase, double seconds);
  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_ = 0;
  std::string job_ = "";
  prometheus::Family<prometheus::Counter>& micro_steps_;
  prometheus::Family<prometheus::Counter>& allreduce_calls_;
  prometheus::Family<prometheus::Counter>& allreduce_bytes_;
  prometheus::Family<prometheus::Counter>& tokens_;
  prometheus::Family<prometheus::Counter>& checkpoint_failures_;
  prometheus::Family<prometheus::Histogram>& phase_;
  prometheus::Family<prometheus::Gauge>& build_info_;
};

}  // namespace trainstep

#endif  // TRAINSTEP_WORKER_METRICS_H_
