// The coordinator's gRPC server around a Coordinator: what its health services say while the
// journal cannot be written.
#include "coordinator/server.h"

#include <grpcpp/grpcpp.h>

#include "common/env.h"
#include "gtest/gtest.h"
#include "tests/grpc_health_util.h"
#include "tests/unit/coordinator/disk_full_env.h"
#include "tests/unit/coordinator/machine_test_util.h"
#include "tests/unit/coordinator/server_fixture.h"
#include "trainstep/v1/job_service.grpc.pb.h"

namespace trainstep {
namespace {

using testing_util::HealthBecomes;
using testing_util::HealthCheck;
using testing_util::kNotServing;
using testing_util::kServing;

class ServerTest : public testing_util::CoordinatorServerTest {
 protected:
  ServerTest() { env_ = &disk_; }

  grpc::Status Submit(v1::Job* job) {
    v1::SubmitJobRequest submit;
    submit.set_spec_json(testing_util::SpecJson({}));
    grpc::ClientContext ctx;
    return stub_->SubmitJob(&ctx, submit, job);
  }

  DiskFullEnv disk_{Env::Default()};  // outlives coordinator_ (TearDown ends it)
};

// Catches a coordinator whose probes would restart it for a full disk (a restart does not
// free space, and would drop the reads it still serves), and one whose named decisions
// service says SERVING while it holds every decision, or stays NOT_SERVING once it resumed.
TEST_F(ServerTest, HoldingDecisionsIsNotServingForDecisionsOnlyAndResumesByItself) {
  EXPECT_EQ(HealthCheck(channel_), kServing);
  EXPECT_EQ(HealthCheck(channel_, kDecisionsHealthService), kServing);
  v1::Job job;
  ASSERT_TRUE(Submit(&job).ok());

  disk_.SetFull(true);
  v1::Job held;
  const grpc::Status refused = Submit(&held);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE) << refused.error_message();
  EXPECT_TRUE(HealthBecomes(channel_, kDecisionsHealthService, kNotServing));
  EXPECT_EQ(HealthCheck(channel_), kServing);
  {
    v1::GetJobRequest get;
    get.set_job_id(job.job_id());
    v1::Job read;
    grpc::ClientContext ctx;
    const grpc::Status s = stub_->GetJob(&ctx, get, &read);
    EXPECT_TRUE(s.ok()) << s.error_message();  // reads are served
  }

  disk_.SetFull(false);
  EXPECT_TRUE(HealthBecomes(channel_, kDecisionsHealthService, kServing));
  EXPECT_EQ(HealthCheck(channel_), kServing);
  v1::Job again;
  EXPECT_TRUE(Submit(&again).ok());
}

}  // namespace
}  // namespace trainstep
