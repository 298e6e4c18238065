#include "coordinator/job_service.h"

#include <grpcpp/grpcpp.h>

#include <filesystem>
#include <memory>
#include <string>

#include "absl/strings/string_view.h"
#include "common/env.h"
#include "gtest/gtest.h"
#include "tests/unit/coordinator/machine_test_util.h"
#include "tests/unit/coordinator/server_fixture.h"
#include "tests/unit/coordinator/sync_gate.h"
#include "trainstep/v1/job_service.grpc.pb.h"

namespace trainstep {
namespace {

bool IsLog(const std::string& path) {
  return absl::string_view(std::filesystem::path(path).filename().string()).substr(0, 4) == "log-";
}

class JobServiceTest : public testing_util::CoordinatorServerTest {
 protected:
  JobServiceTest() { env_ = &gate_; }
  void TearDown() override {
    gate_.Release();  // nothing may stay held while the coordinator shuts down
    CoordinatorServerTest::TearDown();
  }

  SyncGate gate_{Env::Default(), &IsLog};  // outlives coordinator_ (TearDown ends it)
};

// Catches: a watch whose next batch was decided while the client was still there but
// delivered after it left (the answer waits for the journal's fsync): the stream was deleted
// when gRPC finished with it, and the late answer wrote into freed memory (found by
// ThreadSanitizer and AddressSanitizer, which fail this test).
TEST_F(JobServiceTest, AnAnswerThatArrivesAfterTheClientLeftFindsTheStreamAlive) {
  v1::SubmitJobRequest submit;
  testing_util::SpecOptions spec;
  spec.workers = 2;
  submit.set_spec_json(testing_util::SpecJson(spec));
  v1::Job job;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub_->SubmitJob(&ctx, submit, &job).ok());
  }

  grpc::ClientContext watch_ctx;
  v1::WatchJobRequest watch;
  watch.set_job_id(job.job_id());
  std::unique_ptr<grpc::ClientReader<v1::WatchJobEvent>> reader =
      stub_->WatchJob(&watch_ctx, watch);
  v1::WatchJobEvent first;
  ASSERT_TRUE(reader->Read(&first));  // the job: the stream now waits for news
  ASSERT_TRUE(first.has_job());

  // News that the watch is answered with only once the journal's fsync returns.
  gate_.HoldNext();
  v1::CancelJobRequest cancel;
  cancel.set_job_id(job.job_id());
  coordinator_->CancelJob(cancel, [](absl::StatusOr<v1::Job>) {});
  gate_.WaitUntilHeld();

  // The client leaves; a refused call on the same connection is a round trip after the
  // cancellation, so the server has let go of the stream when the answer is released.
  watch_ctx.TryCancel();
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  {
    grpc::ClientContext ctx;
    v1::WatchJobRequest both;
    both.set_job_id(job.job_id());
    both.set_from_window_id(3);
    both.mutable_after()->set_window_id(1);
    v1::WatchJobEvent event;
    std::unique_ptr<grpc::ClientReader<v1::WatchJobEvent>> refused = stub_->WatchJob(&ctx, both);
    EXPECT_FALSE(refused->Read(&event));
    EXPECT_EQ(refused->Finish().error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  }
  gate_.Release();

  // The coordinator still answers, and a new watch sees the cancelled job.
  grpc::ClientContext again_ctx;
  std::unique_ptr<grpc::ClientReader<v1::WatchJobEvent>> again = stub_->WatchJob(&again_ctx, watch);
  v1::WatchJobEvent event;
  ASSERT_TRUE(again->Read(&event));
  ASSERT_TRUE(event.has_job());
  EXPECT_EQ(event.job().state(), v1::CANCELLED) << event.job().ShortDebugString();
  again_ctx.TryCancel();
  again->Finish();
}

}  // namespace
}  // namespace trainstep
