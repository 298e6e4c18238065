// The worker's gRPC health service (worker/link/health_service.h), as a liveness probe sees it.
#include "worker/link/health_service.h"

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "gtest/gtest.h"
#include "tests/grpc_health_util.h"

namespace trainstep {
namespace {

using testing_util::HealthBecomes;
using testing_util::HealthCheck;
using testing_util::kNotServing;
using testing_util::kServing;

// Catches a liveness probe that never fails for a hung worker (Kubernetes would leave it
// hung for ever), or one that fails for a worker that only waits for its peers.
TEST(WorkerHealthTest, NotServingOnceTheComputeThreadIsStuckAndServingWhenItMovesOn) {
  FakeClock clock;
  ComputePhase phase(&clock);
  phase.SetDeadlines(absl::Seconds(5), absl::Seconds(600));
  absl::StatusOr<std::unique_ptr<WorkerHealth>> health =
      WorkerHealth::Start("127.0.0.1:0", &phase, absl::Milliseconds(5));
  ASSERT_TRUE(health.ok()) << health.status();
  const std::shared_ptr<grpc::Channel> probe = grpc::CreateChannel(
      absl::StrCat("127.0.0.1:", (*health)->port()), grpc::InsecureChannelCredentials());
  phase.Enter(v1::COMPUTE_PHASE_REPORT);
  clock.Advance(absl::Seconds(60));
  EXPECT_EQ(HealthCheck(probe), kServing);  // waiting for the others is no hang

  phase.Enter(v1::COMPUTE_PHASE_FORWARD_BACKWARD);
  clock.Advance(absl::Seconds(6));
  EXPECT_TRUE(HealthBecomes(probe, "", kNotServing));
  phase.Enter(v1::COMPUTE_PHASE_REPORT);
  EXPECT_TRUE(HealthBecomes(probe, "", kServing));
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
