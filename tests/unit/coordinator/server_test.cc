// The coordinator's gRPC server around a Coordinator: what its health services say while the
// journal cannot be written.
#include "coordinator/server.h"

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/env.h"
#include "coordinator/coordinator.h"
#include "gtest/gtest.h"
#include "tests/unit/coordinator/disk_full_env.h"
#include "tests/unit/coordinator/machine_test_util.h"
#include "trainstep/v1/job_service.grpc.pb.h"

namespace trainstep {
namespace {

constexpr char kServing[] = "\x08\x01";     // HealthCheckResponse{status: SERVING}
constexpr char kNotServing[] = "\x08\x02";  // HealthCheckResponse{status: NOT_SERVING}

class ServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           absl::StrCat("trainstep-server-", getpid(), "-",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    CoordinatorOptions options;
    options.state_dir = (dir_ / "state").string();
    options.env = &disk_;
    absl::StatusOr<std::unique_ptr<Coordinator>> c = Coordinator::Open(options);
    ASSERT_TRUE(c.ok()) << c.status();
    coordinator_ = std::move(*c);
    absl::StatusOr<std::unique_ptr<CoordinatorServer>> s =
        CoordinatorServer::Start(coordinator_.get(), "127.0.0.1:0");
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = std::move(*s);
    channel_ = grpc::CreateChannel(absl::StrCat("127.0.0.1:", server_->port()),
                                   grpc::InsecureChannelCredentials());
    stub_ = v1::JobService::NewStub(channel_);
  }
  void TearDown() override {
    server_.reset();
    coordinator_.reset();
    std::filesystem::remove_all(dir_);
  }

  // grpc.health.v1.Health/Check of `service` ("" = the server as a whole): the raw answer.
  std::string Health(const std::string& service) {
    std::string request;
    if (!service.empty()) request = absl::StrCat("\x0a", std::string(1, service.size()), service);
    grpc::GenericStub stub(channel_);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    grpc::Slice slice(request);
    grpc::ByteBuffer req(&slice, 1), resp;
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
  // Waits (bounded) until `service`'s health answer is `want`; the driver updates it at its
  // next tick.
  bool HealthBecomes(const std::string& service, const std::string& want) {
    for (const absl::Time give_up = absl::Now() + absl::Seconds(30); absl::Now() < give_up;) {
      if (Health(service) == want) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }
  grpc::Status Submit(v1::Job* job) {
    v1::SubmitJobRequest submit;
    submit.set_spec_json(testing_util::SpecJson({}));
    grpc::ClientContext ctx;
    return stub_->SubmitJob(&ctx, submit, job);
  }

  std::filesystem::path dir_;
  DiskFullEnv disk_{Env::Default()};  // outlives coordinator_
  std::unique_ptr<Coordinator> coordinator_;
  std::unique_ptr<CoordinatorServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::JobService::Stub> stub_;
};

// Catches a coordinator whose probes would restart it for a full disk (a restart does not
// free space, and would drop the reads it still serves), and one whose named decisions
// service says SERVING while it holds every decision, or stays NOT_SERVING once it resumed.
TEST_F(ServerTest, HoldingDecisionsIsNotServingForDecisionsOnlyAndResumesByItself) {
  EXPECT_EQ(Health(""), kServing);
  EXPECT_EQ(Health(kDecisionsHealthService), kServing);
  v1::Job job;
  ASSERT_TRUE(Submit(&job).ok());

  disk_.SetFull(true);
  v1::Job held;
  const grpc::Status refused = Submit(&held);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE) << refused.error_message();
  EXPECT_TRUE(HealthBecomes(kDecisionsHealthService, kNotServing));
  EXPECT_EQ(Health(""), kServing);
  {
    v1::GetJobRequest get;
    get.set_job_id(job.job_id());
    v1::Job read;
    grpc::ClientContext ctx;
    const grpc::Status s = stub_->GetJob(&ctx, get, &read);
    EXPECT_TRUE(s.ok()) << s.error_message();  // reads are served
  }

  disk_.SetFull(false);
  EXPECT_TRUE(HealthBecomes(kDecisionsHealthService, kServing));
  EXPECT_EQ(Health(""), kServing);
  v1::Job again;
  EXPECT_TRUE(Submit(&again).ok());
}

}  // namespace
}  // namespace trainstep
