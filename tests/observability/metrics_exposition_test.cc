// Both /metrics endpoints of a running job, scraped over plain HTTP and piped to
// `promtool check metrics` (the Prometheus project's own linter), and read back: the series
// CONVENTIONS.md lists exist, with label training_job and no per-rank or per-window labels,
// and the counters agree with the per-update log.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "tests/observability/observability_util.h"
#include "tests/observability/observed_job.h"

#ifdef TRAINSTEP_HAVE_WORKER
#include "tests/integration/process_cluster.h"
#endif

namespace trainstep::obs {
namespace {

std::string TestDir() {
  return (std::filesystem::temp_directory_path() /
          absl::StrCat("trainstep-obs-", getpid(), "-",
                       ::testing::UnitTest::GetInstance()->current_test_info()->name()))
      .string();
}

// Runs `promtool check metrics` on `exposition`; "" when it passes, else what it said.
std::string PromtoolProblems(const std::string& promtool, const std::string& exposition) {
  const ProcessResult r = RunProgram({promtool, "check", "metrics"}, exposition, absl::Seconds(30));
  if (r.exit_code == 0 && absl::StripAsciiWhitespace(r.output).empty()) return "";
  return absl::StrCat("promtool check metrics exited ", r.exit_code, ":\n", r.output);
}

const std::vector<std::string> kCoordinatorSeries = {
    "trainstep_optimizer_updates_total",
    "trainstep_windows_skipped_total",
    "trainstep_windows_aborted_total",
    "trainstep_loss_scale",
    "trainstep_learning_rate",
    "trainstep_tokens_total",
    "trainstep_update_tokens",
    "trainstep_loss",
    "trainstep_grad_norm",
    "trainstep_window_duration_seconds_bucket",
    "trainstep_window_duration_seconds_sum",
    "trainstep_window_duration_seconds_count",
    "trainstep_barrier_wait_seconds_bucket",
    "trainstep_workers",
    "trainstep_world_size",
    "trainstep_generation",
    "trainstep_checkpoint_id",
    "trainstep_last_commit_timestamp_seconds",
    "trainstep_jobs",
    "trainstep_job_state",
    "trainstep_job_start_timestamp_seconds",
    "trainstep_journal_fsync_seconds_bucket",
    "trainstep_build_info",
    "trainstep_micro_step_id",
    "trainstep_dropped_samples_total",
    "trainstep_checkpoints_damaged_total",
    "trainstep_update_interval_seconds_bucket",
    "trainstep_update_interval_seconds_count",
};

const std::vector<std::string> kWorkerSeries = {
    "trainstep_worker_micro_steps_total",     "trainstep_worker_allreduce_calls_total",
    "trainstep_worker_allreduce_bytes_total", "trainstep_worker_compute_seconds_bucket",
    "trainstep_worker_tokens_total",          "trainstep_build_info",
};

// Labels no series may carry: they grow with the run (CONVENTIONS.md, Prometheus).
const std::set<std::string> kUnboundedLabels = {"rank",      "window",     "window_id", "worker",
                                                "worker_id", "generation", "update"};

void ExpectSeries(const std::vector<Sample>& samples, const std::vector<std::string>& names,
                  const std::string& what) {
  const std::set<std::string> have = SampleNames(samples);
  for (const std::string& n : names) {
    EXPECT_TRUE(have.count(n)) << what << " does not export " << n << "; it has "
                               << absl::StrJoin(have, ", ");
  }
  for (const Sample& s : samples) {
    if (!absl::StartsWith(s.name, "trainstep_")) continue;
    for (const auto& [label, value] : s.labels) {
      EXPECT_FALSE(kUnboundedLabels.count(label))
          << what << ": " << s.name << " has label " << label;
      EXPECT_NE(label, "job") << what << ": " << s.name
                              << " uses `job`, which Prometheus reserves for the scrape target";
    }
  }
}

class MetricsExpositionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::optional<std::string> p = FindProgram("promtool");
    if (!p.has_value()) {
      GTEST_SKIP() << "promtool not found: it comes with the Debian package `prometheus` "
                      "(scripts/install-deps.sh installs it)";
    }
    promtool_ = *p;
    dir_ = TestDir();
  }
  void TearDown() override {
    if (!HasFailure() && !dir_.empty()) std::filesystem::remove_all(dir_);
  }

  std::string promtool_;
  std::string dir_;
};

// Scraped twice: while the job runs (paused at window 20, the workers active) and after it
// ended. Catches: a counter without _total, a non-base unit, a missing HELP, a label named
// `job`, a series CONVENTIONS.md promises that never appears, values that drift from the log.
TEST_F(MetricsExpositionTest, BothEndpointsPassPromtoolWhileRunningAndAfter) {
  ObservedJobOptions options;
  options.pause_at_window = 20;
  absl::StatusOr<std::unique_ptr<ObservedJob>> started = ObservedJob::Start(dir_, options);
  ASSERT_TRUE(started.ok()) << started.status();
  ObservedJob& job = **started;
  ASSERT_TRUE(job.SubmitAndRun().ok());
  ASSERT_TRUE(job.WaitUntilPaused(absl::Seconds(60))) << job.Logs();

  for (const char* phase : {"running", "ended"}) {
    SCOPED_TRACE(phase);
    if (std::string(phase) == "ended") {
      absl::StatusOr<v1::Job> ended = job.WaitForEnd(absl::Seconds(60));
      ASSERT_TRUE(ended.ok()) << ended.status();
      ASSERT_EQ(ended->state(), v1::SUCCEEDED) << ended->message();
    }
    absl::StatusOr<std::string> coordinator = HttpGet(job.coordinator_metrics_port(), "/metrics");
    ASSERT_TRUE(coordinator.ok()) << coordinator.status();
    EXPECT_EQ(PromtoolProblems(promtool_, *coordinator), "") << *coordinator;
    absl::StatusOr<std::vector<Sample>> samples = ParseExposition(*coordinator);
    ASSERT_TRUE(samples.ok()) << samples.status();
    ExpectSeries(*samples, kCoordinatorSeries, "the coordinator");
    const std::map<std::string, std::string> of_job = {{"training_job", job.job_id()}};
    EXPECT_EQ(FindSample(*samples, "trainstep_job_state",
                         {{"training_job", job.job_id()},
                          {"state", phase == std::string("running") ? "running" : "succeeded"}}),
              1.0);

    // The counters against the per-update log.
    absl::StatusOr<std::vector<v1::UpdateRecord>> log = job.Updates();
    ASSERT_TRUE(log.ok()) << log.status();
    ASSERT_FALSE(log->empty());
    int64_t commits = 0, tokens = 0;
    std::map<std::string, int64_t> skips;
    for (const v1::UpdateRecord& r : *log) {
      if (r.outcome() == "commit") {
        ++commits;
        tokens += r.global_valid_tokens();
      }
      if (r.outcome() == "skip") ++skips[absl::AsciiStrToLower(r.reason())];
    }
    EXPECT_GT(skips["overflow"], 0);
    EXPECT_GT(skips["empty_window"], 0);
    EXPECT_EQ(FindSample(*samples, "trainstep_optimizer_updates_total", of_job), commits);
    EXPECT_EQ(FindSample(*samples, "trainstep_tokens_total", of_job), tokens);
    for (const auto& [reason, n] : skips) {
      EXPECT_EQ(FindSample(*samples, "trainstep_windows_skipped_total",
                           {{"training_job", job.job_id()}, {"reason", reason}}),
                n)
          << reason;
    }
    // A reason that never happened is exported as 0, so ratios and rate() see it from the start.
    EXPECT_EQ(FindSample(*samples, "trainstep_windows_skipped_total",
                         {{"training_job", job.job_id()}, {"reason", "nonfinite_loss"}}),
              0.0);
    EXPECT_EQ(FindSample(*samples, "trainstep_windows_aborted_total",
                         {{"training_job", job.job_id()}, {"reason", "worker_lost"}}),
              0.0);
    EXPECT_EQ(FindSample(*samples, "trainstep_loss_scale", of_job), log->back().loss_scale());
    EXPECT_EQ(FindSample(*samples, "trainstep_world_size", of_job), 2.0);
    const v1::UpdateRecord* last_commit = nullptr;
    for (const v1::UpdateRecord& r : *log) {
      if (r.outcome() == "commit") last_commit = &r;
    }
    ASSERT_NE(last_commit, nullptr);
    EXPECT_EQ(FindSample(*samples, "trainstep_grad_norm",
                         {{"training_job", job.job_id()}, {"stage", "pre_clip"}}),
              last_commit->grad_norm_pre_clip());
    EXPECT_EQ(FindSample(*samples, "trainstep_grad_norm",
                         {{"training_job", job.job_id()}, {"stage", "post_clip"}}),
              last_commit->grad_norm_post_clip());
    EXPECT_EQ(FindSample(*samples, "trainstep_grad_norm",
                         {{"training_job", job.job_id()}, {"stage", "scaled"}}),
              last_commit->grad_norm_scaled());
    EXPECT_EQ(FindSample(*samples, "trainstep_update_interval_seconds_count", of_job), commits);
    absl::StatusOr<v1::Job> now = job.GetJob();
    ASSERT_TRUE(now.ok()) << now.status();
    EXPECT_EQ(FindSample(*samples, "trainstep_micro_step_id", of_job),
              now->progress().micro_step_id());
    EXPECT_GT(now->progress().micro_step_id(), 0);
    EXPECT_EQ(FindSample(*samples, "trainstep_dropped_samples_total", of_job), 0.0);
    // prometheus-cpp writes 16 significant digits: the last bit of a double may differ.
    EXPECT_NEAR(FindSample(*samples, "trainstep_loss", of_job).value_or(-1), last_commit->loss(),
                1e-12 * std::abs(last_commit->loss()));
    for (int port : job.worker_metrics_ports()) {
      absl::StatusOr<std::string> worker = HttpGet(port, "/metrics");
      ASSERT_TRUE(worker.ok()) << worker.status();
      EXPECT_EQ(PromtoolProblems(promtool_, *worker), "") << *worker;
      absl::StatusOr<std::vector<Sample>> ws = ParseExposition(*worker);
      ASSERT_TRUE(ws.ok()) << ws.status();
      ExpectSeries(*ws, kWorkerSeries, absl::StrCat("the worker on port ", port));
      EXPECT_GT(FindSample(*ws, "trainstep_worker_micro_steps_total", of_job).value_or(0), 0);
    }
  }
}

// A coordinator with no job yet: the endpoint is already valid (HELP/TYPE, build info).
TEST_F(MetricsExpositionTest, IdleCoordinatorPassesPromtool) {
  absl::StatusOr<std::unique_ptr<ObservedJob>> started = ObservedJob::Start(dir_);
  ASSERT_TRUE(started.ok()) << started.status();
  absl::StatusOr<std::string> text = HttpGet((*started)->coordinator_metrics_port(), "/metrics");
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(PromtoolProblems(promtool_, *text), "") << *text;
  EXPECT_TRUE(absl::StrContains(*text, "trainstep_build_info{")) << *text;
}

// Catches the probe's finding on a running system: two idle connections to the coordinator's
// metrics port made every scrape wait for civetweb's 30 s timeout. With eight idle clients on
// each endpoint (the coordinator process and a worker's), scrapes still answer; the 15 s bound
// only keeps a starved endpoint from hanging the test. Needs no promtool.
TEST(MetricsEndpointTest, ScrapesAnswerWhileIdleClientsHoldConnections) {
  const std::string dir = TestDir();
  ObservedJobOptions options;
  options.pause_at_window = 3;
  absl::StatusOr<std::unique_ptr<ObservedJob>> started = ObservedJob::Start(dir, options);
  ASSERT_TRUE(started.ok()) << started.status();
  ObservedJob& job = **started;
  ASSERT_TRUE(job.SubmitAndRun().ok());
  ASSERT_TRUE(job.WaitUntilPaused(absl::Seconds(60))) << job.Logs();
  std::vector<int> ports = {job.coordinator_metrics_port()};
  for (int port : job.worker_metrics_ports()) ports.push_back(port);
  ASSERT_EQ(ports.size(), 3u);
  std::vector<int> idle;
  for (int port : ports) {
    for (int i = 0; i < 8; ++i) {
      absl::StatusOr<int> fd = ConnectLoopback(port);
      ASSERT_TRUE(fd.ok()) << fd.status();
      idle.push_back(*fd);
    }
  }
  for (int port : ports) {
    absl::StatusOr<std::string> text = HttpGet(port, "/metrics", absl::Seconds(15));
    ASSERT_TRUE(text.ok()) << "port " << port << ": " << text.status();
    EXPECT_TRUE(absl::StrContains(*text, "trainstep_build_info{")) << *text;
  }
  for (int fd : idle) close(fd);
  job.Resume();
  absl::StatusOr<v1::Job> ended = job.WaitForEnd(absl::Seconds(60));
  ASSERT_TRUE(ended.ok()) << ended.status();
  started->reset();
  if (!::testing::Test::HasFailure()) std::filesystem::remove_all(dir);
}

#ifdef TRAINSTEP_HAVE_WORKER
// The real binaries: trainstep-coordinator and two trainstep-worker processes training the
// mlp, each worker with its own /metrics (--metrics-listen 127.0.0.1:0, --port-file).
// Scraped while the job runs, then the job is cancelled.
TEST_F(MetricsExpositionTest, RealWorkerProcessesPassPromtool) {
  absl::StatusOr<std::unique_ptr<::trainstep::testing::ProcessCluster>> c =
      ::trainstep::testing::ProcessCluster::Start(dir_);
  ASSERT_TRUE(c.ok()) << c.status();
  auto& cluster = **c;
  absl::StatusOr<std::string> id = cluster.Submit(
      R"({"name":"metrics","model":{"mlp":{"hidden":16}},)"
      R"("data":{"synthetic_regression":{"samples":4096,"in_features":4}},)"
      R"("batch":{"micro_batch_size":4,"accumulation_steps":2},"workers":{"count":2},)"
      R"("optimizer":{"sgd":{"lr":0.01}},"stop":{"epochs":1000}})");
  ASSERT_TRUE(id.ok()) << id.status();
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(
        cluster
            .StartWorker(*id, {"--metrics-listen", "127.0.0.1:0", "--port-file",
                               absl::StrCat(dir_, "/worker-", i, ".ports"), "--log-format", "json"})
            .ok());
  }
  std::vector<int> ports;
  for (int i = 0; i < 2; ++i) {
    const std::string file = absl::StrCat(dir_, "/worker-", i, ".ports");
    std::map<std::string, int64_t> p;
    ASSERT_TRUE(
        WaitFor([&] { return (p = ParsePortFile(ReadFileOrEmpty(file))).count("metrics_port"); },
                absl::Seconds(60)))
        << cluster.Logs();
    ports.push_back(static_cast<int>(p["metrics_port"]));
  }
  // Until both workers have run a few windows.
  for (int port : ports) {
    ASSERT_TRUE(WaitFor(
        [&] {
          absl::StatusOr<std::string> t = HttpGet(port, "/metrics");
          if (!t.ok()) return false;
          absl::StatusOr<std::vector<Sample>> s = ParseExposition(*t);
          return s.ok() &&
                 FindSample(*s, "trainstep_worker_micro_steps_total", {{"training_job", *id}})
                         .value_or(0) >= 4;
        },
        absl::Seconds(120)))
        << cluster.Logs();
  }
  const std::map<std::string, int64_t> coord = ParsePortFile(ReadFileOrEmpty(dir_ + "/ports.json"));
  ASSERT_TRUE(coord.count("metrics_port"));
  std::vector<int> all = ports;
  all.push_back(static_cast<int>(coord.at("metrics_port")));
  for (int port : all) {
    absl::StatusOr<std::string> text = HttpGet(port, "/metrics");
    ASSERT_TRUE(text.ok()) << text.status();
    EXPECT_EQ(PromtoolProblems(promtool_, *text), "") << *text;
    absl::StatusOr<std::vector<Sample>> s = ParseExposition(*text);
    ASSERT_TRUE(s.ok()) << s.status();
    ExpectSeries(*s, port == all.back() ? kCoordinatorSeries : kWorkerSeries,
                 absl::StrCat("port ", port));
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::CancelJobRequest req;
  req.set_job_id(*id);
  v1::Job cancelled;
  EXPECT_TRUE(cluster.jobs()->CancelJob(&ctx, req, &cancelled).ok());
  cluster.WaitForWorkers(absl::Seconds(30));
  // The workers ran with --log-format json: every line of their stderr is a JSON object.
  for (int i = 0; i < 2; ++i) {
    const std::string log = ReadFileOrEmpty(absl::StrCat(dir_, "/worker-", i, ".log"));
    EXPECT_FALSE(log.empty());
    for (absl::string_view line : absl::StrSplit(log, '\n', absl::SkipEmpty())) {
      absl::StatusOr<google::protobuf::Value> v = ParseJson(std::string(line));
      EXPECT_TRUE(v.ok() && v->has_struct_value()) << "worker-" << i << ": " << line;
    }
  }
}
#endif  // TRAINSTEP_HAVE_WORKER

}  // namespace
}  // namespace trainstep::obs
