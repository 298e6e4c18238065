// A gtest fixture owning a ProcessCluster in a fresh temporary directory named after the
// test; the directory is removed after a passing test (kept on failure, or always with
// TRAINSTEP_KEEP_TEST_DIRS set, for the logs).
#ifndef TRAINSTEP_TESTS_INTEGRATION_CLUSTER_TEST_H_
#define TRAINSTEP_TESTS_INTEGRATION_CLUSTER_TEST_H_

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tests/integration/process_cluster.h"

namespace trainstep::testing {

class ClusterTest : public ::testing::Test {
 protected:
  explicit ClusterTest(std::string prefix) : prefix_(std::move(prefix)) {}

  void SetUp() override {
    dir_ = (std::filesystem::temp_directory_path() /
            absl::StrCat(prefix_, getpid(), "-",
                         ::testing::UnitTest::GetInstance()->current_test_info()->name()))
               .string();
    absl::StatusOr<std::unique_ptr<ProcessCluster>> c = ProcessCluster::Start(dir_);
    ASSERT_TRUE(c.ok()) << c.status();
    cluster_ = std::move(*c);
  }
  void TearDown() override {
    cluster_.reset();
    if (!HasFailure() && getenv("TRAINSTEP_KEEP_TEST_DIRS") == nullptr) {
      std::filesystem::remove_all(dir_);
    }
  }

  // The job as GetJob answers it now (an empty one if the call failed).
  v1::Job GetJob(const std::string& job_id) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::GetJobRequest req;
    req.set_job_id(job_id);
    v1::Job job;
    (void)cluster_->jobs()->GetJob(&ctx, req, &job);
    return job;
  }

  // The job's workers as ListWorkers answers now (none if the call failed).
  std::vector<v1::WorkerInfo> Workers(const std::string& job_id) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::ListWorkersRequest req;
    req.set_job_id(job_id);
    v1::ListWorkersResponse resp;
    if (!cluster_->jobs()->ListWorkers(&ctx, req, &resp).ok()) return {};
    return {resp.workers().begin(), resp.workers().end()};
  }

  // How many of the job's workers are in `state` now.
  int CountWorkers(const std::string& job_id, v1::WorkerState state) {
    int n = 0;
    for (const v1::WorkerInfo& w : Workers(job_id)) n += w.state() == state ? 1 : 0;
    return n;
  }

  // Polls the job (bounded) until `pred` holds; false if it never did.
  template <typename Pred>
  bool WaitUntil(const std::string& job_id, Pred pred, absl::Duration timeout) {
    const absl::Time give_up = absl::Now() + timeout;
    while (absl::Now() < give_up) {
      if (pred(GetJob(job_id))) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }

  std::string prefix_;
  std::string dir_;
  std::unique_ptr<ProcessCluster> cluster_;
};

}  // namespace trainstep::testing

#endif  // TRAINSTEP_TESTS_INTEGRATION_CLUSTER_TEST_H_
