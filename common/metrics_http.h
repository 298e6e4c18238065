// The Prometheus /metrics endpoint that the coordinator and every worker serve: prometheus-cpp's
// Exposer (civetweb), configured so that idle or slow clients cannot starve the scrapes.
// civetweb gives each connection a worker thread until that connection's request is read; with
// the Exposer's defaults (2 threads, civetweb's 30 s request timeout) two idle connections
// blocked every scrape for 30 s.
#ifndef TRAINSTEP_COMMON_METRICS_HTTP_H_
#define TRAINSTEP_COMMON_METRICS_HTTP_H_

#include <prometheus/exposer.h>
#include <prometheus/registry.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace trainstep {

// Connections served at once; more wait at most kMetricsRequestTimeoutMs for a free thread.
inline constexpr int kMetricsThreads = 16;
// A connection that sends no complete request (or reads no response) for this long is closed.
inline constexpr int kMetricsRequestTimeoutMs = 5000;

struct MetricsEndpoint {
  std::unique_ptr<prometheus::Exposer> exposer;
  int port = 0;  // the port bound (the one chosen when `address` asked for port 0)
};

// Serves `registry` at http://address/metrics (address: host:port, port 0 = a free one).
// UNAVAILABLE naming the address if it cannot listen.
absl::StatusOr<MetricsEndpoint> StartMetricsEndpoint(
    const std::string& address, const std::shared_ptr<prometheus::Registry>& registry);

}  // namespace trainstep

#endif  // TRAINSTEP_COMMON_METRICS_HTTP_H_
