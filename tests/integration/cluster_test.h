// A gtest fixture owning a ProcessCluster in a fresh temporary directory named after the
// test; the directory is removed after a passing test (kept on failure, or always with
// TRAINSTEP_KEEP_TEST_DIRS set, for the logs).
#ifndef TRAINSTEP_TESTS_INTEGRATION_CLUSTER_TEST_H_
#define TRAINSTEP_TESTS_INTEGRATION_CLUSTER_TEST_H_

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
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

  std::string prefix_;
  std::string dir_;
  std::unique_ptr<ProcessCluster> cluster_;
};

}  // namespace trainstep::testing

#endif  // TRAINSTEP_TESTS_INTEGRATION_CLUSTER_TEST_H_
