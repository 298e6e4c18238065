// The coordinator binary as operators run it: SIGTERM while workers wait in a barrier.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "tests/integration/process_cluster.h"
#include "tests/integration/simulated_worker.h"

namespace trainstep {
namespace {

// SIGTERM drains: a rank blocked in BeginWindow is answered (UNAVAILABLE, retryable) instead
// of hanging, the process exits 0 within its grace period and says so in its log.
// Catches: a shutdown that waits forever on barrier calls, or exits without flushing.
TEST(CoordinatorProcessTest, SigtermDrainsWaitingCallsAndExitsZero) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / absl::StrCat("trainstep-sigterm-", getpid()))
          .string();
  absl::StatusOr<std::unique_ptr<testing::ProcessCluster>> c = testing::ProcessCluster::Start(dir);
  ASSERT_TRUE(c.ok()) << c.status();
  absl::StatusOr<std::string> job = (*c)->Submit(
      R"({"model":{"mlp":{}},"data":{"synthetic_regression":{"samples":64}},"workers":{"count":2}})");
  ASSERT_TRUE(job.ok()) << job.status();
  // Rank 0 joins and reports window 1; rank 1 never comes, so rank 0 waits in the barrier.
  testing::SimulatedWorker w0((*c)->address(), *job, 64,
                              [](int64_t, int) { return testing::SimReport{}; });
  testing::SimulatedWorker w1((*c)->address(), *job, 64,
                              [](int64_t, int) { return testing::SimReport{}; });
  ASSERT_TRUE(w0.Register("w0").ok());
  ASSERT_TRUE(w1.Register("w1").ok());
  w1.Crash();  // registered (so the generation forms) but never reports a window
  std::thread run([&] { (void)w0.Run(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(800));
  const int code = (*c)->TerminateCoordinator(absl::Seconds(15));
  w0.Crash();
  run.join();
  EXPECT_EQ(code, 0) << (*c)->Logs();
  std::ifstream log(dir + "/coordinator.log");
  std::stringstream text;
  text << log.rdbuf();
  EXPECT_NE(text.str().find("draining"), std::string::npos) << text.str();
  EXPECT_NE(text.str().find("stopped"), std::string::npos) << text.str();
  c->reset();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace trainstep
