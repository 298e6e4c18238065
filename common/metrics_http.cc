#include "common/metrics_http.h"

#include <exception>
#include <vector>

#include "absl/strings/str_cat.h"

namespace trainstep {

absl::StatusOr<MetricsEndpoint> StartMetricsEndpoint(
    const std::string& address, const std::shared_ptr<prometheus::Registry>& registry) {
  // civetweb options (https://github.com/civetweb/civetweb/blob/master/docs/UserManual.md).
  std::vector<std::string> options = {
      "listening_ports",
      address,
      "num_threads",
      absl::StrCat(kMetricsThreads),
      "request_timeout_ms",
      absl::StrCat(kMetricsRequestTimeoutMs),
      // A kept-alive connection holds its thread between scrapes: one request per connection.
      "enable_keep_alive",
      "no",
  };
  MetricsEndpoint endpoint;
  try {
    endpoint.exposer = std::make_unique<prometheus::Exposer>(std::move(options));
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", address, ": ", e.what()));
  }
  endpoint.exposer->RegisterCollectable(registry);
  const std::vector<int> ports = endpoint.exposer->GetListeningPorts();
  endpoint.port = ports.empty() ? 0 : ports[0];
  return endpoint;
}

}  // namespace trainstep
