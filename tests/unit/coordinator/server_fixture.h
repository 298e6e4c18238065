// A Coordinator (journal in a temporary directory, real clock) behind a running
// CoordinatorServer on a loopback port, with a channel and a JobService stub to it: the fixture
// of the tests that reach the coordinator through gRPC.
#ifndef TRAINSTEP_TESTS_UNIT_COORDINATOR_SERVER_FIXTURE_H_
#define TRAINSTEP_TESTS_UNIT_COORDINATOR_SERVER_FIXTURE_H_

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/env.h"
#include "coordinator/coordinator.h"
#include "coordinator/server.h"
#include "gtest/gtest.h"
#include "trainstep/v1/job_service.grpc.pb.h"

namespace trainstep {
namespace testing_util {

// Base of a gRPC-level coordinator test: derive, set env_ in the constructor, add helpers.
class CoordinatorServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const ::testing::TestInfo* test = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = std::filesystem::temp_directory_path() /
           absl::StrCat("trainstep-", test->test_suite_name(), "-", getpid(), "-", test->name());
    std::filesystem::remove_all(dir_);
    CoordinatorOptions options;
    options.state_dir = (dir_ / "state").string();
    options.env = env_;
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

  std::filesystem::path dir_;
  // A derived fixture points this at an Env wrapper of its own (a full disk, a held fsync);
  // TearDown ends the coordinator before the wrapper goes.
  Env* env_ = Env::Default();
  std::unique_ptr<Coordinator> coordinator_;
  std::unique_ptr<CoordinatorServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::JobService::Stub> stub_;
};

}  // namespace testing_util
}  // namespace trainstep

#endif  // TRAINSTEP_TESTS_UNIT_COORDINATOR_SERVER_FIXTURE_H_
