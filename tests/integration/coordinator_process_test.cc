// The coordinator binary as operators run it: SIGTERM while workers wait in a barrier, a
// state directory it cannot open, a SIGSTOP longer than the lease.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
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
  // w1 stops once it is READY or placed (its heartbeat reported the dataset), so the generation
  // forms with it, but never reports a window. Stopped before that, it would keep the generation
  // from forming at all, and rank 0 would wait for an assignment, not in the barrier.
  const auto w1_ready = [&] {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::ListWorkersRequest req;
    req.set_job_id(*job);
    v1::ListWorkersResponse resp;
    if (!(*c)->jobs()->ListWorkers(&ctx, req, &resp).ok()) return false;
    for (const v1::WorkerInfo& w : resp.workers()) {
      if (w.worker_id() == w1.worker_id()) return w.state() == v1::READY || w.state() == v1::ACTIVE;
    }
    return false;
  };
  for (const absl::Time give_up = absl::Now() + absl::Seconds(60);
       !w1_ready() && absl::Now() < give_up;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(w1_ready()) << (*c)->Logs();
  w1.Crash();
  std::thread run([&] { (void)w0.Run(); });
  // Terminated once rank 0 has sent its BeginWindow (it then waits in the barrier for rank 1),
  // however long a loaded machine takes to get it there.
  for (const absl::Time give_up = absl::Now() + absl::Seconds(60);
       w0.plain_begins() < 1 && absl::Now() < give_up;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_GE(w0.plain_begins(), 1);
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

// In `dir`: the state of a coordinator that journaled three jobs and stopped.
void StopWithThreeJobs(const std::string& dir, std::string* state) {
  *state = dir + "/state";
  absl::StatusOr<std::unique_ptr<testing::ProcessCluster>> c = testing::ProcessCluster::Start(dir);
  ASSERT_TRUE(c.ok()) << c.status();
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE((*c)->Submit(R"({"model":{"mlp":{}},"data":{"synthetic_regression":{}}})").ok());
  }
  ASSERT_EQ((*c)->TerminateCoordinator(absl::Seconds(15)), 0);
}

// `coordinator --state-dir state_dir` to its end, as `uid` when set: its exit code, its
// output in `log`.
int RunOnState(const std::string& coordinator, const std::string& state_dir, const std::string& log,
               std::optional<uid_t> uid = std::nullopt) {
  absl::StatusOr<int> code = testing::RunToExit(
      {coordinator, "--listen", "127.0.0.1:0", "--metrics-listen", "", "--state-dir", state_dir},
      log, absl::Seconds(30), uid);
  EXPECT_TRUE(code.ok()) << code.status();
  return code.value_or(-1);
}

// Catches the probe's crash: a coordinator whose state could not be opened segfaulted (exit
// 139, nothing on stderr) in ~Coordinator. It must print the reason, naming the file and the
// offset where there is one, and exit 1, for a journal damaged mid-file and a state
// "directory" that is a file (a read-only one: the next test).
TEST(CoordinatorProcessTest, UnopenableStateExitsOneWithTheReason) {
  const std::string dir = testing::TempDir("badstate");
  std::string state;
  ASSERT_NO_FATAL_FAILURE(StopWithThreeJobs(dir, &state));
  const std::string coordinator = testing::BinDir() + "/trainstep-coordinator";
  const std::string log_file = state + "/log-000001";

  // One byte of the second record's length flipped: damage mid-file, refused untouched.
  const std::string before = testing::ReadFile(log_file);
  ASSERT_GT(before.size(), 100u);
  const size_t second =
      16 + 12 +
      (static_cast<unsigned char>(before[16]) | static_cast<unsigned char>(before[17]) << 8) + 1;
  {
    std::fstream f(log_file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(second);
    f.put(static_cast<char>(before[second] ^ 0x08));
  }
  const std::string damaged = testing::ReadFile(log_file);
  EXPECT_EQ(RunOnState(coordinator, state, dir + "/corrupt.log"), 1);
  std::string text = testing::ReadFile(dir + "/corrupt.log");
  EXPECT_NE(text.find(absl::StrCat(log_file, " is damaged at byte offset ", second, ":")),
            std::string::npos)
      << text;
  EXPECT_EQ(testing::ReadFile(log_file), damaged);  // nothing was changed

  // A file where the state directory should be.
  EXPECT_EQ(RunOnState(coordinator, log_file, dir + "/file.log"), 1);
  text = testing::ReadFile(dir + "/file.log");
  EXPECT_NE(text.find("cannot open the journal in " + log_file), std::string::npos) << text;
  std::filesystem::remove_all(dir);
}

// Catches the probe's crash (above) for a read-only state directory; and this test failing
// with exit 127 where the checkout is closed to other users (cloned under /root, into a
// `mktemp -d`): root runs the coordinator as nobody, who could not execute the build's binary.
TEST(CoordinatorProcessTest, ReadOnlyStateExitsOneWithTheReason) {
  const std::string dir = testing::TempDir("readonly");
  std::string state;
  ASSERT_NO_FATAL_FAILURE(StopWithThreeJobs(dir, &state));
  std::string coordinator = testing::BinDir() + "/trainstep-coordinator";
  std::optional<uid_t> unprivileged;
  if (geteuid() == 0) {  // root ignores permissions: the coordinator runs as nobody
    unprivileged = 65534;
    ASSERT_EQ(chmod(dir.c_str(), 0755), 0);
    absl::StatusOr<std::string> copy = testing::CopyForOtherUsers(coordinator, dir + "/bin");
    ASSERT_TRUE(copy.ok()) << copy.status();
    coordinator = *copy;
    absl::StatusOr<int> probe = testing::RunToExit({coordinator, "--help"}, dir + "/probe.log",
                                                   absl::Seconds(30), unprivileged);
    ASSERT_TRUE(probe.ok()) << probe.status();
    if (*probe == 127) {  // execv failed
      GTEST_SKIP() << "nobody (uid 65534) cannot execute " << coordinator
                   << ": a folder above it (TMPDIR?) is closed to other users";
    }
  }
  const std::string log_file = state + "/log-000001";
  ASSERT_EQ(chmod(state.c_str(), 0555), 0);
  ASSERT_EQ(chmod(log_file.c_str(), 0444), 0);
  EXPECT_EQ(RunOnState(coordinator, state, dir + "/readonly.log", unprivileged), 1);
  const std::string text = testing::ReadFile(dir + "/readonly.log");
  EXPECT_NE(text.find("cannot open the journal in " + state), std::string::npos) << text;
  EXPECT_NE(text.find("Permission denied"), std::string::npos) << text;
  ASSERT_EQ(chmod(state.c_str(), 0755), 0);
  std::filesystem::remove_all(dir);
}

// Catches the probe's finding: SIGSTOP of the coordinator for longer than the lease, then
// SIGCONT, expired every lease before the heartbeats queued meanwhile were read; the workers
// were "declared lost" and the job failed. Now the stall is detected and the job succeeds
// without losing anyone.
TEST(CoordinatorProcessTest, PauseLongerThanTheLeaseDoesNotFailTheJob) {
  const std::string dir = testing::TempDir("pause");
  absl::StatusOr<std::unique_ptr<testing::ProcessCluster>> c =
      testing::ProcessCluster::Start(dir, /*worker_lease=*/absl::Milliseconds(1000));
  ASSERT_TRUE(c.ok()) << c.status();
  // 120 windows of 2 × 8 samples, each rank taking ~20 ms per window: a few seconds of work.
  absl::StatusOr<std::string> job =
      (*c)->Submit(R"({"model":{"mlp":{}},"data":{"synthetic_regression":{"samples":1920}},)"
                   R"("workers":{"count":2}})");
  ASSERT_TRUE(job.ok()) << job.status();
  std::atomic<int64_t> windows{0};
  const auto slow = [&windows](int64_t window, int) {
    windows = window;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    return testing::SimReport{};
  };
  testing::SimulatedWorker w0((*c)->address(), *job, 1920, slow);
  testing::SimulatedWorker w1((*c)->address(), *job, 1920, slow);
  ASSERT_TRUE(w0.Register("w0").ok());
  ASSERT_TRUE(w1.Register("w1").ok());
  absl::Status s0, s1;
  std::thread t0([&] { s0 = w0.Run(); });
  std::thread t1([&] { s1 = w1.Run(); });
  // Paused once the job is under way, however long that takes on a loaded machine.
  for (const absl::Time give_up = absl::Now() + absl::Seconds(60);
       windows < 10 && absl::Now() < give_up;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_GE(windows.load(), 10) << (*c)->Logs();
  ASSERT_EQ(kill((*c)->coordinator_pid(), SIGSTOP), 0);
  std::this_thread::sleep_for(std::chrono::seconds(3));
  ASSERT_EQ(kill((*c)->coordinator_pid(), SIGCONT), 0);
  t0.join();
  t1.join();
  EXPECT_TRUE(s0.ok()) << s0 << (*c)->Logs();
  EXPECT_TRUE(s1.ok()) << s1;
  absl::StatusOr<v1::Job> done = (*c)->WaitForJob(*job, absl::Seconds(60));
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->state(), v1::SUCCEEDED) << done->message();
  EXPECT_EQ(done->progress().generation(), 1);  // nobody was lost
  EXPECT_EQ(done->progress().windows_aborted(), 0);
  EXPECT_NE(testing::ReadFile(dir + "/coordinator.log").find("did not run for"), std::string::npos)
      << (*c)->Logs();
  c->reset();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace trainstep
