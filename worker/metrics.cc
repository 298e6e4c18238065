#include "worker/metrics.h"

#include "absl/strings/str_cat.h"
#include "common/metrics_http.h"
#include "common/status_macros.h"
#include "common/version.h"

namespace trainstep {

WorkerMetrics::WorkerMetrics()
    : registry_(std::make_shared<prometheus::Registry>()),
      micro_steps_(prometheus::BuildCounter()
                       .Name("trainstep_worker_micro_steps_total")
                       .Help("Micro-batches run (forward + backward)")
                       .Register(*registry_)),
      allreduce_calls_(prometheus::BuildCounter()
                           .Name("trainstep_worker_allreduce_calls_total")
                           .Help("Gradient all-reduce calls (one per bucket per window)")
                           .Register(*registry_)),
      allreduce_bytes_(prometheus::BuildCounter()
                           .Name("trainstep_worker_allreduce_bytes_total")
                           .Help("Gradient bytes all-reduced")
                           .Register(*registry_)),
      tokens_(prometheus::BuildCounter()
                  .Name("trainstep_worker_tokens_total")
                  .Help("Valid tokens (or samples) this worker trained")
                  .Register(*registry_)),
      checkpoint_failures_(prometheus::BuildCounter()
                               .Name("trainstep_worker_checkpoint_failures_total")
                               .Help("Checkpoints this worker could not write (the previous "
                                     "durable one stayed; training went on)")
                               .Register(*registry_)),
      phase_(prometheus::BuildHistogram()
                 .Name("trainstep_worker_compute_seconds")
                 .Help("Time per phase of a window")
                 .Register(*registry_)),
      build_info_(prometheus::BuildGauge()
                      .Name("trainstep_build_info")
                      .Help("Build information (value 1)")
                      .Register(*registry_)) {
  build_info_.Add({{"version", TrainstepVersion()}, {"component", "worker"}}).Set(1);
}

absl::StatusOr<std::unique_ptr<WorkerMetrics>> WorkerMetrics::Start(const std::string& address) {
  auto m = std::make_unique<WorkerMetrics>();
  ASSIGN_OR_RETURN(MetricsEndpoint endpoint, StartMetricsEndpoint(address, m->registry_));
  m->exposer_ = std::move(endpoint.exposer);
  m->port_ = endpoint.port;
  return m;
}

void WorkerMetrics::SetJob(const std::string& job_id) { job_ = job_id; }

void WorkerMetrics::AddMicroSteps(int64_t n) {
  micro_steps_.Add({{"training_job", job_}}).Increment(static_cast<double>(n));
}

void WorkerMetrics::AddAllReduce(int64_t calls, int64_t bytes) {
  allreduce_calls_.Add({{"training_job", job_}}).Increment(static_cast<double>(calls));
  allreduce_bytes_.Add({{"training_job", job_}}).Increment(static_cast<double>(bytes));
}

void WorkerMetrics::AddTokens(int64_t n) {
  tokens_.Add({{"training_job", job_}}).Increment(static_cast<double>(n));
}

void WorkerMetrics::AddCheckpointFailure() {
  checkpoint_failures_.Add({{"training_job", job_}}).Increment();
}

void WorkerMetrics::ObservePhase(absl::string_view phase, double seconds) {
  static const prometheus::Histogram::BucketBoundaries kBuckets = {
      0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 60};
  phase_.Add({{"training_job", job_}, {"phase", std::string(phase)}}, kBuckets).Observe(seconds);
}

}  // namespace trainstep
