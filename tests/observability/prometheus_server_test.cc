// The real Prometheus server (Debian's /usr/bin/prometheus) on 127.0.0.1, configured from
// deploy/prometheus/prometheus.yml.in with rules.yml, scrapes a running job every second: a
// trainstep-coordinator process driven by simulated workers, each with a worker /metrics.
// Its HTTP API must then report what the per-update log says: the committed-update
// counter, the loss scale, the skips; the rules load and evaluate.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "tests/observability/observability_util.h"
#include "tests/observability/observed_job.h"

namespace trainstep::obs {
namespace {

struct QuerySample {
  std::map<std::string, std::string> labels;
  double value = 0;
};

// GET /api/v1/query?query=... → the instant vector.
absl::StatusOr<std::vector<QuerySample>> Query(int port, const std::string& promql) {
  absl::StatusOr<std::string> body =
      HttpGet(port, absl::StrCat("/api/v1/query?query=", UrlEncode(promql)));
  if (!body.ok()) return body.status();
  absl::StatusOr<google::protobuf::Value> v = ParseJson(*body);
  if (!v.ok()) return v.status();
  const google::protobuf::Value* status = JsonPath(*v, {"status"});
  const google::protobuf::Value* result = JsonPath(*v, {"data", "result"});
  if (status == nullptr || status->string_value() != "success" || result == nullptr ||
      !result->has_list_value()) {
    return absl::InternalError(absl::StrCat("query ", promql, " failed: ", *body));
  }
  std::vector<QuerySample> out;
  for (const google::protobuf::Value& item : result->list_value().values()) {
    QuerySample s;
    if (const google::protobuf::Value* m = JsonPath(item, {"metric"}); m != nullptr) {
      for (const auto& [k, val] : m->struct_value().fields()) s.labels[k] = val.string_value();
    }
    const google::protobuf::Value* pair = JsonPath(item, {"value"});
    if (pair == nullptr || pair->list_value().values_size() != 2 ||
        !absl::SimpleAtod(pair->list_value().values(1).string_value(), &s.value)) {
      return absl::InternalError(absl::StrCat("unexpected sample in ", *body));
    }
    out.push_back(std::move(s));
  }
  return out;
}

// The one value `promql` returns, or nullopt (none, several, or an error).
std::optional<double> QueryOne(int port, const std::string& promql) {
  absl::StatusOr<std::vector<QuerySample>> r = Query(port, promql);
  if (!r.ok() || r->size() != 1) return std::nullopt;
  return r->front().value;
}

std::string Targets(const std::vector<int>& ports) {
  std::vector<std::string> quoted;
  for (int p : ports) quoted.push_back(absl::StrCat("\"127.0.0.1:", p, "\""));
  return absl::StrJoin(quoted, ", ");
}

class PrometheusServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::optional<std::string> p = FindProgram("prometheus");
    if (!p.has_value()) {
      GTEST_SKIP() << "prometheus not found: it comes with the Debian package `prometheus` "
                      "(scripts/install-deps.sh installs it)";
    }
    prometheus_bin_ = *p;
    dir_ = (std::filesystem::temp_directory_path() /
            absl::StrCat("trainstep-prom-", getpid(), "-",
                         ::testing::UnitTest::GetInstance()->current_test_info()->name()))
               .string();
  }
  void TearDown() override {
    if (prometheus_) prometheus_->Stop();
    job_.reset();
    if (!HasFailure() && !dir_.empty()) std::filesystem::remove_all(dir_);
  }

  // Renders deploy/prometheus/prometheus.yml.in for this job's endpoints.
  std::string RenderConfig() {
    const std::string tmpl = ReadFileOrEmpty(SourceDir() + "/deploy/prometheus/prometheus.yml.in");
    EXPECT_FALSE(tmpl.empty()) << "cannot read deploy/prometheus/prometheus.yml.in";
    return absl::StrReplaceAll(
        tmpl, {{"@SCRAPE_INTERVAL@", "1s"},
               {"@RULE_FILE@", SourceDir() + "/deploy/prometheus/rules.yml"},
               {"@COORDINATOR_TARGETS@", Targets({job_->coordinator_metrics_port()})},
               {"@WORKER_TARGETS@", Targets(job_->worker_metrics_ports())}});
  }

  // Starts prometheus on a free loopback port; a port taken in between is retried.
  void StartPrometheus(const std::string& config_path) {
    for (int attempt = 0; attempt < 3; ++attempt) {
      absl::StatusOr<int> port = PickFreePort();
      ASSERT_TRUE(port.ok()) << port.status();
      absl::StatusOr<std::unique_ptr<ChildProcess>> p =
          ChildProcess::Start({prometheus_bin_, absl::StrCat("--config.file=", config_path),
                               absl::StrCat("--storage.tsdb.path=", dir_, "/tsdb"),
                               absl::StrCat("--web.listen-address=127.0.0.1:", *port),
                               "--storage.tsdb.retention.time=1h", "--log.level=warn"},
                              dir_ + "/prometheus.log");
      ASSERT_TRUE(p.ok()) << p.status();
      prometheus_ = std::move(*p);
      port_ = *port;
      const bool ready =
          WaitFor([&] { return !prometheus_->running() || HttpGet(port_, "/-/ready").ok(); },
                  absl::Seconds(60));
      if (ready && prometheus_->running()) return;
      prometheus_->Stop();
    }
    FAIL() << "prometheus did not become ready:\n" << prometheus_->LogTail();
  }

  std::string prometheus_bin_;
  std::string dir_;
  std::unique_ptr<ObservedJob> job_;
  std::unique_ptr<ChildProcess> prometheus_;
  int port_ = 0;
};

// Catches: series Prometheus cannot ingest, a template that does not load, rules that do
// not parse or evaluate, and a counter or gauge that disagrees with the per-update log
// (e.g. the loss scale of a skipped window not exported, updates counted on skips).
TEST_F(PrometheusServerTest, ReportsWhatThePerUpdateLogSays) {
  ObservedJobOptions options;
  options.pause_at_window = 20;
  absl::StatusOr<std::unique_ptr<ObservedJob>> started = ObservedJob::Start(dir_ + "/job", options);
  ASSERT_TRUE(started.ok()) << started.status();
  job_ = std::move(*started);

  const std::string config = RenderConfig();
  ASSERT_EQ(config.find('@'), std::string::npos) << "a placeholder was left:\n" << config;
  ASSERT_TRUE(WriteFile(dir_ + "/prometheus.yml", config).ok());
  if (std::optional<std::string> promtool = FindProgram("promtool")) {
    const ProcessResult check =
        RunProgram({*promtool, "check", "config", dir_ + "/prometheus.yml"});
    EXPECT_EQ(check.exit_code, 0) << check.output;
  }
  StartPrometheus(dir_ + "/prometheus.yml");
  if (HasFatalFailure()) return;

  ASSERT_TRUE(job_->SubmitAndRun().ok());
  const std::string id = job_->job_id();
  const std::string sel = absl::StrCat("{training_job=\"", id, "\"}");

  // Every target is scraped and up.
  EXPECT_TRUE(WaitFor(
      [&] {
        absl::StatusOr<std::vector<QuerySample>> up = Query(port_, "up == 1");
        return up.ok() && up->size() == 1 + job_->worker_metrics_ports().size();
      },
      absl::Seconds(30)))
      << prometheus_->LogTail();

  // Compares Prometheus with the log until they agree (a scrape lands every second).
  auto expect_matches_log = [&](const std::string& when) {
    absl::StatusOr<std::vector<v1::UpdateRecord>> log = job_->Updates();
    ASSERT_TRUE(log.ok()) << log.status();
    ASSERT_FALSE(log->empty());
    int64_t commits = 0, skips = 0;
    for (const v1::UpdateRecord& r : *log) {
      commits += r.outcome() == "commit";
      skips += r.outcome() == "skip";
    }
    const double scale = log->back().loss_scale();
    std::optional<double> updates, got_scale, got_skips;
    const bool agree = WaitFor(
        [&] {
          updates = QueryOne(port_, absl::StrCat("trainstep_optimizer_updates_total", sel));
          got_scale = QueryOne(port_, absl::StrCat("trainstep_loss_scale", sel));
          got_skips =
              QueryOne(port_, absl::StrCat("sum(trainstep_windows_skipped_total", sel, ")"));
          return updates == static_cast<double>(commits) && got_scale == scale &&
                 got_skips == static_cast<double>(skips);
        },
        absl::Seconds(30));
    EXPECT_TRUE(agree) << when << ": the log has " << commits << " commits, " << skips
                       << " skips, loss scale " << scale << "; Prometheus says "
                       << updates.value_or(-1) << ", " << got_skips.value_or(-1) << ", "
                       << got_scale.value_or(-1);
    // The loss scale moved during the run (overflows back it off), so this compares
    // something that could have been stale.
    std::set<double> scales;
    for (const v1::UpdateRecord& r : *log) scales.insert(r.loss_scale());
    EXPECT_GT(scales.size(), 1u) << when;
  };

  ASSERT_TRUE(job_->WaitUntilPaused(absl::Seconds(60))) << job_->Logs();
  expect_matches_log("while running (paused before window 20)");
  // A scrape can fail on a loaded machine (its timeout is the 1 s interval), leaving the series
  // stale for a moment: ask until Prometheus has it, bounded.
  EXPECT_TRUE(WaitFor(
      [&] {
        return QueryOne(port_, absl::StrCat("trainstep_job_state{training_job=\"", id,
                                            "\",state=\"running\"}")) == 1.0;
      },
      absl::Seconds(30)));

  absl::StatusOr<v1::Job> ended = job_->WaitForEnd(absl::Seconds(60));
  ASSERT_TRUE(ended.ok()) << ended.status();
  ASSERT_EQ(ended->state(), v1::SUCCEEDED) << ended->message();
  expect_matches_log("after the job ended");

  // The workers' endpoints were scraped too.
  std::optional<double> micro_steps =
      QueryOne(port_, absl::StrCat("sum(trainstep_worker_micro_steps_total", sel, ")"));
  EXPECT_GT(micro_steps.value_or(0), 0);

  // rules.yml loaded and evaluates: both groups healthy, the recording rules produce samples.
  absl::StatusOr<std::string> rules = HttpGet(port_, "/api/v1/rules");
  ASSERT_TRUE(rules.ok()) << rules.status();
  absl::StatusOr<google::protobuf::Value> rv = ParseJson(*rules);
  ASSERT_TRUE(rv.ok()) << rv.status();
  const google::protobuf::Value* groups = JsonPath(*rv, {"data", "groups"});
  ASSERT_NE(groups, nullptr) << *rules;
  std::set<std::string> rule_names;
  for (const google::protobuf::Value& g : groups->list_value().values()) {
    for (const google::protobuf::Value& r : JsonPath(g, {"rules"})->list_value().values()) {
      rule_names.insert(JsonPath(r, {"name"})->string_value());
      EXPECT_EQ(JsonPath(r, {"health"})->string_value(), "ok") << *rules;
    }
  }
  EXPECT_EQ(rule_names, (std::set<std::string>{
                            "training_job:trainstep_optimizer_updates:rate5m",
                            "training_job:trainstep_windows_skipped:ratio_rate5m",
                            "TrainingStalled", "HighSkipRate", "TrainingStraggler", "RankHung",
                            "JournalUnwritable", "CheckpointDamaged", "CoordinatorDown"}));
  for (const char* record : {"training_job:trainstep_optimizer_updates:rate5m",
                             "training_job:trainstep_windows_skipped:ratio_rate5m"}) {
    EXPECT_TRUE(WaitFor([&] { return QueryOne(port_, absl::StrCat(record, sel)).has_value(); },
                        absl::Seconds(30)))
        << record << " has no sample for " << id;
  }
  // The coordinator is up, so CoordinatorDown is not firing.
  EXPECT_EQ(QueryOne(port_, "ALERTS{alertname=\"CoordinatorDown\",alertstate=\"firing\"}"),
            std::nullopt);
}

}  // namespace
}  // namespace trainstep::obs
