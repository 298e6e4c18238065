#include "common/metrics_http.h"

#include <prometheus/counter.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/observability/observability_util.h"

namespace trainstep {
namespace {

// Catches the probe's finding: two idle connections blocked every scrape of the coordinator's
// metrics endpoint until civetweb's 30 s timeout freed them (2 threads by default). Eight
// idle and two slow clients (half a request line) must leave scrapes answering at once; the
// scrape's 15 s bound only keeps a starved endpoint from hanging the test.
TEST(MetricsHttpTest, ScrapesAnswerWhileIdleAndSlowClientsHoldConnections) {
  auto registry = std::make_shared<prometheus::Registry>();
  prometheus::BuildCounter().Name("trainstep_test_total").Help("test").Register(*registry).Add({});
  absl::StatusOr<MetricsEndpoint> endpoint = StartMetricsEndpoint("127.0.0.1:0", registry);
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  ASSERT_GT(endpoint->port, 0);

  std::vector<int> held;
  for (int i = 0; i < 10; ++i) {
    absl::StatusOr<int> fd = obs::ConnectLoopback(endpoint->port);
    ASSERT_TRUE(fd.ok()) << fd.status();
    held.push_back(*fd);
    if (i >= 8) {  // slow: half a request line, then nothing
      const std::string partial = "GET /metr";
      EXPECT_EQ(send(*fd, partial.data(), partial.size(), MSG_NOSIGNAL),
                static_cast<ssize_t>(partial.size()));
    }
  }
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<std::string> body = obs::HttpGet(endpoint->port, "/metrics", absl::Seconds(15));
    ASSERT_TRUE(body.ok()) << "scrape " << i << ": " << body.status();
    EXPECT_NE(body->find("trainstep_test_total 0"), std::string::npos) << *body;
  }
  for (int fd : held) close(fd);
}

// Catches an endpoint that binds somewhere else than asked, or a busy port that is not an
// error naming the address.
TEST(MetricsHttpTest, BusyPortIsAnErrorNamingTheAddress) {
  auto registry = std::make_shared<prometheus::Registry>();
  absl::StatusOr<MetricsEndpoint> first = StartMetricsEndpoint("127.0.0.1:0", registry);
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string address = "127.0.0.1:" + std::to_string(first->port);
  absl::StatusOr<MetricsEndpoint> second = StartMetricsEndpoint(address, registry);
  ASSERT_FALSE(second.ok());
  EXPECT_NE(std::string(second.status().message()).find(address), std::string::npos);
}

}  // namespace
}  // namespace trainstep
