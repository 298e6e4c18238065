// The worker's gRPC health service (worker/link/health_service.h), as a liveness probe sees it.
#include "worker/link/health_service.h"

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/clock.h"
#include "gtest/gtest.h"

namespace trainstep {
namespace {

constexpr char kServing[] = "\x08\x01";     // HealthCheckResponse{status: SERVING}
constexpr char kNotServing[] = "\x08\x02";  // HealthCheckResponse{status: NOT_SERVING}

// grpc.health.v1.Health/Check of the server as a whole: the raw answer.
std::string Check(int port) {
  grpc::GenericStub stub(
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::Slice empty("");  // HealthCheckRequest{}: the server as a whole
  grpc::ByteBuffer req(&empty, 1), resp;
  absl::Notification done;
  grpc::Status status;
  stub.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &req, &resp,
                 [&](grpc::Status s) {
                   status = s;
                   done.Notify();
                 });
  done.WaitForNotification();
  if (!status.ok()) return absl::StrCat("error: ", status.error_message());
  std::vector<grpc::Slice> slices;
  (void)resp.Dump(&slices);
  std::string out;
  for (const grpc::Slice& s : slices) out.append(s.begin(), s.end());
  return out;
}

// Waits (bounded) until the probe's answer is `want`: the service looks every few ms.
bool Becomes(int port, const std::string& want) {
  for (const absl::Time give_up = absl::Now() + absl::Seconds(30); absl::Now() < give_up;) {
    if (Check(port) == want) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

// Catches a liveness probe that never fails for a hung worker (Kubernetes would leave it
// hung for ever), or one that fails for a worker that only waits for its peers.
TEST(WorkerHealthTest, NotServingOnceTheComputeThreadIsStuckAndServingWhenItMovesOn) {
  FakeClock clock;
  ComputePhase phase(&clock);
  phase.SetDeadlines(absl::Seconds(5), absl::Seconds(600));
  absl::StatusOr<std::unique_ptr<WorkerHealth>> health =
      WorkerHealth::Start("127.0.0.1:0", &phase, absl::Milliseconds(5));
  ASSERT_TRUE(health.ok()) << health.status();
  const int port = (*health)->port();
  phase.Enter(v1::COMPUTE_PHASE_REPORT);
  clock.Advance(absl::Seconds(60));
  EXPECT_EQ(Check(port), kServing);  // waiting for the others is no hang

  phase.Enter(v1::COMPUTE_PHASE_FORWARD_BACKWARD);
  clock.Advance(absl::Seconds(6));
  EXPECT_TRUE(Becomes(port, kNotServing));
  phase.Enter(v1::COMPUTE_PHASE_REPORT);
  EXPECT_TRUE(Becomes(port, kServing));
}

// Catches a worker that starts although its health address cannot be served.
TEST(WorkerHealthTest, AnAddressItCannotListenOnIsAnError) {
  ComputePhase phase;
  absl::StatusOr<std::unique_ptr<WorkerHealth>> health =
      WorkerHealth::Start("not-an-address", &phase);
  ASSERT_FALSE(health.ok());
  EXPECT_NE(std::string(health.status().message()).find("--health-listen"), std::string::npos);
}

}  // namespace
}  // namespace trainstep
