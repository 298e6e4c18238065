// The coordinator over real gRPC on 127.0.0.1, driven by simulated workers (threads
// speaking WorkerService): the protocol end to end without LibTorch.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "coordinator/coordinator.h"
#include "coordinator/loss_scaler.h"
#include "coordinator/server.h"
#include "core/spec.h"
#include "tests/integration/simulated_worker.h"
#include "trainstep/v1/job_service.grpc.pb.h"

namespace trainstep {
namespace {

using testing::SimReport;
using testing::SimulatedWorker;

// A spec whose dataset of `samples` regression samples makes `samples / workers` windows
// per epoch (one sample per rank per window).
std::string Spec(int workers, int64_t samples, const std::string& extra = "") {
  return absl::StrCat(R"({"name":"loopback","model":{"mlp":{}},)",
                      R"("data":{"synthetic_regression":{"samples":)", samples, R"(}},)",
                      R"("batch":{"micro_batch_size":1,"accumulation_steps":1},)",
                      R"("workers":{"count":)", workers, "}", extra, "}");
}

// Runs every worker's Run() on its own thread and returns their statuses.
std::vector<absl::Status> RunAll(std::vector<std::unique_ptr<SimulatedWorker>>& workers) {
  std::vector<absl::Status> statuses(workers.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < workers.size(); ++i) {
    threads.emplace_back([&, i] { statuses[i] = workers[i]->Run(); });
  }
  for (std::thread& t : threads) t.join();
  for (auto& w : workers) w->StopHeartbeats();
  return statuses;
}

class LoopbackTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           absl::StrCat("trainstep-loopback-", getpid(), "-",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    StartCoordinator(absl::Seconds(30));
  }
  void TearDown() override {
    server_.reset();
    coordinator_.reset();
    std::filesystem::remove_all(dir_);
  }

  void StartCoordinator(absl::Duration lease, int port = 0) {
    CoordinatorOptions options;
    options.state_dir = dir_.string();
    options.machine.worker_lease = lease;
    absl::StatusOr<std::unique_ptr<Coordinator>> c = Coordinator::Open(options);
    ASSERT_TRUE(c.ok()) << c.status();
    coordinator_ = std::move(*c);
    absl::StatusOr<std::unique_ptr<CoordinatorServer>> s =
        CoordinatorServer::Start(coordinator_.get(), absl::StrCat("127.0.0.1:", port));
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = std::move(*s);
    address_ = absl::StrCat("127.0.0.1:", server_->port());
    jobs_ = v1::JobService::NewStub(MakeChannel(address_));
  }

  void StopCoordinator() {
    server_->Shutdown(absl::ZeroDuration());
    server_.reset();
    coordinator_.reset();
  }

  std::string Submit(const std::string& spec_json) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::SubmitJobRequest req;
    req.set_request_id(absl::StrCat("req-", spec_json.size()));
    req.set_spec_json(spec_json);
    v1::Job job;
    grpc::Status s = jobs_->SubmitJob(&ctx, req, &job);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return job.job_id();
  }

  v1::Job GetJob(const std::string& id) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::GetJobRequest req;
    req.set_job_id(id);
    v1::Job job;
    grpc::Status s = jobs_->GetJob(&ctx, req, &job);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return job;
  }

  std::vector<v1::UpdateRecord> AllUpdates(const std::string& id) {
    std::vector<v1::UpdateRecord> out;
    std::string token;
    do {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
      v1::ListUpdatesRequest req;
      req.set_job_id(id);
      req.set_page_size(300);
      req.set_page_token(token);
      v1::ListUpdatesResponse resp;
      grpc::Status s = jobs_->ListUpdates(&ctx, req, &resp);
      EXPECT_TRUE(s.ok()) << s.error_message();
      if (!s.ok()) break;
      for (const auto& r : resp.updates()) out.push_back(r);
      token = resp.next_page_token();
    } while (!token.empty());
    return out;
  }

  // Two ranks and a standby run `windows` windows under a 400 ms lease; whichever worker is
  // rank 1 of the first generation crashes as it reports window 20, so the log has
  // (generation 1, window 20) aborted and (2, 20) its retry. Which worker becomes rank 1, and
  // which the standby, depends on who attaches first: the victim is the one the coordinator
  // made rank 1, found from its own assignment, never an index chosen in advance.
  // `*victim` is its index in `*statuses`.
  void RunLosingRank1InWindow20(int64_t windows, std::string* job,
                                std::vector<absl::Status>* statuses, size_t* victim) {
    server_.reset();
    coordinator_.reset();
    StartCoordinator(absl::Milliseconds(400));
    *job = Submit(Spec(2, 2 * windows));
    std::vector<std::unique_ptr<SimulatedWorker>> workers;
    std::atomic<bool> crashed{false};
    std::atomic<size_t> crashed_index{SIZE_MAX};
    for (size_t i = 0; i < 3; ++i) {
      // Each worker's reports come from its own Run thread, so `i` is the reporting worker.
      auto report = [&, i](int64_t window, int rank) {
        if (window == 20 && rank == 1 && !crashed.exchange(true)) {
          crashed_index = i;
          workers[i]->Crash();
        }
        return SimReport{};
      };
      workers.push_back(std::make_unique<SimulatedWorker>(address_, *job, 2 * windows, report));
      ASSERT_TRUE(workers.back()->Register(absl::StrCat("sim-", i)).ok());
    }
    *statuses = RunAll(workers);
    ASSERT_TRUE(crashed.load()) << "no worker reported window 20 as rank 1";
    *victim = crashed_index.load();
  }

  // The body of EightRanksThousandWindows. `pipeline`: each CompleteWindow carries the next
  // window's begin report (one call per window), as the worker's default --pipeline-begin does.
  void RunEightRanksThousandWindows(bool pipeline);
  // The body of CoordinatorRestartLosesNothing, `pipeline` as above.
  void RunCoordinatorRestartLosesNothing(bool pipeline);

  // A WatchJob stream read to its end: its update events, then its status.
  grpc::Status Watch(const v1::WatchJobRequest& req, std::vector<v1::UpdateRecord>* updates) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    std::unique_ptr<grpc::ClientReader<v1::WatchJobEvent>> reader = jobs_->WatchJob(&ctx, req);
    v1::WatchJobEvent event;
    while (reader->Read(&event)) {
      if (event.has_update()) updates->push_back(event.update());
    }
    return reader->Finish();
  }

  std::filesystem::path dir_;
  std::unique_ptr<Coordinator> coordinator_;
  std::unique_ptr<CoordinatorServer> server_;
  std::string address_;
  std::unique_ptr<v1::JobService::Stub> jobs_;
};

// The protocol at scale: W = 8 ranks, 1,000 windows, overflow and empty windows mixed in.
// Catches: barrier mis-counting, ids advanced on skips, the scaler updated per rank instead
// of per window, ranks receiving different decisions, records lost or duplicated.
TEST_F(LoopbackTest, EightRanksThousandWindows) { RunEightRanksThousandWindows(false); }

// The same with one call per window. Catches, beyond the above: a riding answer computed before
// its decision (loss_scale after an overflow), an empty window's end lost when it is reached
// by riding reports, and riding reports that do not save the BeginWindow calls.
TEST_F(LoopbackTest, EightRanksThousandWindowsOneCallEach) { RunEightRanksThousandWindows(true); }

void LoopbackTest::RunEightRanksThousandWindows(bool pipeline) {
  constexpr int kWorld = 8;
  constexpr int64_t kWindows = 1000;
  const std::string job =
      Submit(Spec(kWorld, kWorld * kWindows,
                  R"(,"loss_scaler":{"enabled":true,"init_scale":1024,"growth_interval":50})"));
  auto report = [](int64_t window, int rank) {
    SimReport r;
    r.units = window % 250 == 0 ? 0 : 10 + rank;  // every 250th window trains nothing
    r.loss_sum = 2.0 * r.units;
    r.grad_norm = 1.0 + window * 1e-3;
    r.found_inf = window % 97 == 0;  // all ranks see the same overflow
    return r;
  };
  std::vector<std::unique_ptr<SimulatedWorker>> workers;
  for (int i = 0; i < kWorld; ++i) {
    workers.push_back(std::make_unique<SimulatedWorker>(address_, job, kWorld * kWindows, report));
    workers.back()->set_pipeline_begin(pipeline);
    ASSERT_TRUE(workers.back()->Register(absl::StrCat("sim-", i)).ok());
  }
  for (const absl::Status& s : RunAll(workers)) EXPECT_TRUE(s.ok()) << s;

  const v1::Job done = GetJob(job);
  EXPECT_EQ(done.state(), v1::SUCCEEDED) << done.message();
  const std::vector<v1::UpdateRecord> log = AllUpdates(job);
  ASSERT_EQ(log.size(), kWindows);

  // Replays the scaler independently: once per window, backoff on overflow only.
  LossScalerConfig config;
  config.enabled = true;
  config.init_scale = 1024;
  config.growth_interval = 50;
  LossScaler scaler(config);
  int64_t commits = 0, overflows = 0, empties = 0;
  for (int64_t w = 1; w <= kWindows; ++w) {
    const v1::UpdateRecord& r = log[w - 1];
    ASSERT_EQ(r.window_id(), w);
    EXPECT_EQ(r.world_size(), kWorld);
    if (w % 250 == 0) {
      EXPECT_EQ(r.reason(), "EMPTY_WINDOW") << w;
      ++empties;
    } else if (w % 97 == 0) {
      EXPECT_EQ(r.reason(), "OVERFLOW") << w;
      scaler.Update(true);
      ++overflows;
    } else {
      EXPECT_EQ(r.outcome(), "commit") << w;
      EXPECT_EQ(r.global_valid_tokens(), kWorld * 10 + 28);  // Σ (10 + rank)
      EXPECT_DOUBLE_EQ(r.loss(), 2.0);
      scaler.Update(false);
      ++commits;
    }
    EXPECT_EQ(r.optimizer_update_id(), commits) << w;
    EXPECT_EQ(r.scheduler_step(), commits) << w;
    EXPECT_EQ(r.loss_scale(), scaler.scale()) << w;
  }
  EXPECT_EQ(done.progress().optimizer_update_id(), commits);
  EXPECT_EQ(done.progress().windows_skipped(), overflows + empties);
  // Every rank saw exactly the same decisions.
  const std::vector<v1::WindowDecision> rank0 = workers[0]->decisions();
  ASSERT_EQ(rank0.size(), kWindows);
  for (int i = 1; i < kWorld; ++i) {
    const std::vector<v1::WindowDecision> other = workers[i]->decisions();
    ASSERT_EQ(other.size(), rank0.size());
    for (size_t k = 0; k < other.size(); ++k) {
      EXPECT_EQ(other[k].SerializeAsString(), rank0[k].SerializeAsString()) << "rank " << i;
    }
  }
  // One BeginWindow of its own per rank without pipelining: every window's. With it: the first
  // window's, and each window's after an empty one (which ends at its barrier, so no
  // CompleteWindow carries its successor's report).
  const int64_t empties_before_last = (kWindows - 1) / 250;
  for (const std::unique_ptr<SimulatedWorker>& w : workers) {
    EXPECT_EQ(w->plain_begins(), pipeline ? 1 + empties_before_last : kWindows);
  }
}

// A rank that dies mid-run: its window aborts (WORKER_LOST), a standby joins the new
// generation, and the aborted window is retried. Catches: a half-applied window, lost or
// duplicated updates across generations, survivors not rejoining.
TEST_F(LoopbackTest, LostWorkerIsReplacedAndWindowRetried) {
  constexpr int64_t kWindows = 60;
  std::string job;
  std::vector<absl::Status> statuses;
  size_t victim = 0;
  ASSERT_NO_FATAL_FAILURE(RunLosingRank1InWindow20(kWindows, &job, &statuses, &victim));
  for (size_t i = 0; i < statuses.size(); ++i) {
    if (i == victim) {
      EXPECT_EQ(statuses[i].code(), absl::StatusCode::kCancelled) << "the crashed worker " << i;
    } else {
      EXPECT_TRUE(statuses[i].ok()) << "worker " << i << ": " << statuses[i];
    }
  }

  EXPECT_EQ(GetJob(job).state(), v1::SUCCEEDED);
  const std::vector<v1::UpdateRecord> log = AllUpdates(job);
  int64_t aborts = 0, next_commit = 1;
  for (const v1::UpdateRecord& r : log) {
    if (r.outcome() == "abort") {
      EXPECT_EQ(r.reason(), "WORKER_LOST");
      EXPECT_EQ(r.window_id(), 20);
      ++aborts;
      continue;
    }
    EXPECT_EQ(r.outcome(), "commit");
    EXPECT_EQ(r.window_id(), next_commit);
    EXPECT_EQ(r.optimizer_update_id(), next_commit);
    ++next_commit;
  }
  EXPECT_EQ(aborts, 1);
  EXPECT_EQ(next_commit - 1, kWindows);
  EXPECT_EQ(GetJob(job).progress().generation(), 2);
}

// Catches: a resumed watch that starts at the given window again (the abort sent twice) or
// leaves out the retry of the same window id, instead of exactly after the given record; and
// a request that mixes `after` with from_window_id being accepted.
TEST_F(LoopbackTest, WatchResumedAfterARecordSendsExactlyTheRest) {
  std::string job;
  std::vector<absl::Status> statuses;
  size_t victim = 0;
  ASSERT_NO_FATAL_FAILURE(RunLosingRank1InWindow20(30, &job, &statuses, &victim));
  const std::vector<v1::UpdateRecord> log = AllUpdates(job);
  size_t abort = 0;
  while (abort < log.size() && log[abort].outcome() != "abort") ++abort;
  ASSERT_GT(abort, 0u);
  ASSERT_LT(abort + 1, log.size());
  ASSERT_EQ(log[abort].window_id(), log[abort + 1].window_id());  // retried under the same id
  for (size_t at : {abort - 1, abort, abort + 1, log.size() - 1}) {
    SCOPED_TRACE(absl::StrCat("after record ", at));
    v1::WatchJobRequest req;
    req.set_job_id(job);
    req.mutable_after()->set_generation(log[at].generation());
    req.mutable_after()->set_window_id(log[at].window_id());
    std::vector<v1::UpdateRecord> sent;
    const grpc::Status s = Watch(req, &sent);
    ASSERT_TRUE(s.ok()) << s.error_message();
    ASSERT_EQ(sent.size(), log.size() - at - 1);
    for (size_t i = 0; i < sent.size(); ++i) {
      EXPECT_EQ(sent[i].SerializeAsString(), log[at + 1 + i].SerializeAsString()) << i;
    }
  }

  // Older clients' from_window_id keeps its meaning: every record from that window on.
  v1::WatchJobRequest from;
  from.set_job_id(job);
  from.set_from_window_id(20);
  std::vector<v1::UpdateRecord> sent;
  ASSERT_TRUE(Watch(from, &sent).ok());
  ASSERT_EQ(sent.size(), log.size() - abort);
  EXPECT_EQ(sent[0].SerializeAsString(), log[abort].SerializeAsString());

  v1::WatchJobRequest both;
  both.set_job_id(job);
  both.set_from_window_id(20);
  both.mutable_after()->set_generation(1);
  both.mutable_after()->set_window_id(19);
  sent.clear();
  const grpc::Status s = Watch(both, &sent);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(),
            "WatchJobRequest sets both after (generation 1, window 19) and from_window_id (20); "
            "set one");
  EXPECT_TRUE(sent.empty());
}

// The coordinator restarts mid-run on the same port and state dir: workers retry, the
// journal restores every id, and no update is applied twice or lost.
TEST_F(LoopbackTest, CoordinatorRestartLosesNothing) { RunCoordinatorRestartLosesNothing(false); }

// The same with one call per window: the restart can come between a decision and the answers
// riding on it, which the new coordinator never counted. Catches a window that then never
// starts (a barrier waiting for reports only the old coordinator held) or starts twice.
TEST_F(LoopbackTest, CoordinatorRestartLosesNothingOneCallEach) {
  RunCoordinatorRestartLosesNothing(true);
}

void LoopbackTest::RunCoordinatorRestartLosesNothing(bool pipeline) {
  constexpr int64_t kWindows = 200;
  constexpr int64_t kRestartBefore = 51;
  const std::string job =
      Submit(Spec(2, 2 * kWindows, R"(,"checkpoint":{"dir":"/tmp/x","every_updates":50})"));
  // Rank 0 is held as it prepares window 51's report (with one call per window: while window
  // 50's report is still unsent) until the coordinator has restarted, so the restart always
  // lands mid-run, whatever the load on the machine: no thread has to win a race to it.
  absl::Notification held, restarted;
  std::atomic<bool> hold_once{false};
  auto report = [&](int64_t window, int rank) {
    if (window == kRestartBefore && rank == 0 && !hold_once.exchange(true)) {
      held.Notify();
      restarted.WaitForNotificationWithTimeout(absl::Seconds(120));
    }
    return SimReport{};
  };
  std::vector<std::unique_ptr<SimulatedWorker>> workers;
  for (int i = 0; i < 2; ++i) {
    workers.push_back(std::make_unique<SimulatedWorker>(address_, job, 2 * kWindows, report));
    workers.back()->set_pipeline_begin(pipeline);
    ASSERT_TRUE(workers.back()->Register(absl::StrCat("sim-", i)).ok());
  }
  bool restart_mid_run = false;
  std::thread restarter([&] {
    restart_mid_run = held.WaitForNotificationWithTimeout(absl::Seconds(120));
    const int port = server_->port();
    StopCoordinator();
    StartCoordinator(absl::Seconds(30), port);
    restarted.Notify();
  });
  std::vector<absl::Status> statuses = RunAll(workers);
  restarter.join();
  EXPECT_TRUE(restart_mid_run) << "rank 0 never prepared window " << kRestartBefore;
  for (const absl::Status& s : statuses) EXPECT_TRUE(s.ok()) << s;
  const v1::Job done = GetJob(job);
  EXPECT_EQ(done.state(), v1::SUCCEEDED) << done.message();
  const std::vector<v1::UpdateRecord> log = AllUpdates(job);
  ASSERT_EQ(log.size(), kWindows);
  for (int64_t w = 1; w <= kWindows; ++w) {
    EXPECT_EQ(log[w - 1].window_id(), w);
    EXPECT_EQ(log[w - 1].optimizer_update_id(), w);
  }
  EXPECT_EQ(done.progress().durable_checkpoint_id(), 4);  // updates 50, 100, 150, 200
  EXPECT_EQ(workers[0]->decisions().size(), kWindows);
}

}  // namespace
}  // namespace trainstep
