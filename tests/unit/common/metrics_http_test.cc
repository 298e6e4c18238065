#include "common/metrics_http.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <prometheus/counter.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace trainstep {
namespace {

// A TCP connection to 127.0.0.1:port; -1 on failure.
int Connect(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// GET /metrics on a fresh connection; the whole answer, or what arrived before the receive
// timeout (a bound on the wait, so a starved endpoint fails the test instead of hanging it).
std::string Scrape(int port) {
  const int fd = Connect(port);
  if (fd < 0) return "";
  timeval timeout{15, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  const std::string request = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  if (send(fd, request.data(), request.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(request.size())) {
    close(fd);
    return "";
  }
  std::string answer;
  char buf[4096];
  while (true) {
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    answer.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return answer;
}

// Catches the probe's finding: two idle connections blocked every scrape of the coordinator's
// metrics endpoint until civetweb's 30 s timeout freed them (2 threads by default). Eight
// idle and two slow clients (half a request line) must leave scrapes answering at once.
TEST(MetricsHttpTest, ScrapesAnswerWhileIdleAndSlowClientsHoldConnections) {
  auto registry = std::make_shared<prometheus::Registry>();
  prometheus::BuildCounter().Name("trainstep_test_total").Help("test").Register(*registry).Add({});
  absl::StatusOr<MetricsEndpoint> endpoint = StartMetricsEndpoint("127.0.0.1:0", registry);
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  ASSERT_GT(endpoint->port, 0);

  std::vector<int> held;
  for (int i = 0; i < 8; ++i) held.push_back(Connect(endpoint->port));
  for (int i = 0; i < 2; ++i) {
    const int fd = Connect(endpoint->port);
    const std::string partial = "GET /metr";
    EXPECT_EQ(send(fd, partial.data(), partial.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(partial.size()));
    held.push_back(fd);
  }
  for (int fd : held) ASSERT_GE(fd, 0);

  for (int i = 0; i < 3; ++i) {
    const std::string answer = Scrape(endpoint->port);
    EXPECT_EQ(answer.rfind("HTTP/1.1 200", 0), 0u) << "scrape " << i << ": " << answer;
    EXPECT_NE(answer.find("trainstep_test_total 0"), std::string::npos) << answer;
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
