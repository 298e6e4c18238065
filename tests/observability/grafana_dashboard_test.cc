// deploy/grafana/trainstep.json against what the services really export: after a run, both
// kinds of /metrics endpoint are scraped, and every panel query (and every rule of
// deploy/prometheus/rules.yml) must name series found there, or recording rules of
// rules.yml, with label names and values that exist. No list of names is written here: a
// metric renamed in the code or a typo in the dashboard fails this test.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "tests/observability/observability_util.h"
#include "tests/observability/observed_job.h"

namespace trainstep::obs {
namespace {

using google::protobuf::Value;

TEST(ReadPromqlTest, FindsMetricsNotFunctionsKeywordsOrVariables) {
  const PromqlRefs r = ReadPromql(
      "histogram_quantile(0.99, sum by (le, training_job) (rate(trainstep_window_duration_seconds_"
      "bucket{training_job=~\"$training_job\", stage = \"pre_clip\"}[$__rate_interval]))) "
      "/ on (training_job) group_left time() - max(x:y:rate5m offset 5m) and bool up == 1e-3");
  EXPECT_EQ(r.metrics, (std::set<std::string>{"trainstep_window_duration_seconds_bucket",
                                              "x:y:rate5m", "up"}));
  EXPECT_EQ(r.grouping_labels, (std::set<std::string>{"le", "training_job"}));
  ASSERT_EQ(r.selectors.size(), 3u);
  ASSERT_EQ(r.selectors[0].matchers.size(), 2u);
  EXPECT_EQ(r.selectors[0].matchers[0].label, "training_job");
  EXPECT_EQ(r.selectors[0].matchers[0].op, "=~");
  EXPECT_EQ(r.selectors[0].matchers[0].value, "$training_job");
  EXPECT_EQ(r.selectors[0].matchers[1].label, "stage");
  EXPECT_EQ(r.selectors[0].matchers[1].op, "=");
  EXPECT_EQ(r.selectors[0].matchers[1].value, "pre_clip");
  EXPECT_TRUE(ReadPromql("vector(1)").metrics.empty());
}

// The PromQL of every rule in a Prometheus rules file (single-line or block scalars).
std::vector<std::string> RuleExpressions(const std::string& yaml) {
  std::vector<std::string> out;
  const std::vector<std::string> lines = absl::StrSplit(yaml, '\n');
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string& line = lines[i];
    const size_t at = line.find("expr:");
    if (at == std::string::npos || line.find_first_not_of(' ') != at) continue;
    std::string rest(absl::StripAsciiWhitespace(line.substr(at + 5)));
    if (rest == "|" || rest == ">" || rest == "|-" || rest == ">-") {
      std::string block;
      for (size_t j = i + 1; j < lines.size(); ++j) {
        const size_t indent = lines[j].find_first_not_of(' ');
        if (indent != std::string::npos && indent <= at) break;
        absl::StrAppend(&block, lines[j], "\n");
      }
      out.push_back(block);
    } else {
      out.push_back(rest);
    }
  }
  return out;
}

std::set<std::string> RecordedNames(const std::string& yaml) {
  std::set<std::string> out;
  const std::regex record(R"(^\s*-?\s*record:\s*(\S+)\s*$)");
  for (const std::string& line : std::vector<std::string>(absl::StrSplit(yaml, '\n'))) {
    std::smatch m;
    if (std::regex_match(line, m, record)) out.insert(m[1]);
  }
  return out;
}

// Every panel, rows' nested panels included.
void CollectPanels(const Value& panels, std::vector<const Value*>* out) {
  for (const Value& p : panels.list_value().values()) {
    out->push_back(&p);
    if (const Value* nested = JsonPath(p, {"panels"}); nested != nullptr) {
      CollectPanels(*nested, out);
    }
  }
}

std::string Str(const Value& v, const std::string& key) {
  const Value* f = JsonPath(v, {key});
  return f == nullptr ? "" : f->string_value();
}

// What the endpoints export: metric → label → values seen.
using Exported = std::map<std::string, std::map<std::string, std::set<std::string>>>;

class GrafanaDashboardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (std::filesystem::temp_directory_path() / absl::StrCat("trainstep-grafana-", getpid()))
               .string();
  }
  void TearDown() override {
    if (!HasFailure()) std::filesystem::remove_all(dir_);
  }

  // Runs a job to its end and scrapes the coordinator and every worker.
  Exported ScrapeAfterARun() {
    Exported exported;
    ObservedJobOptions options;
    options.windows = 30;
    absl::StatusOr<std::unique_ptr<ObservedJob>> started = ObservedJob::Start(dir_, options);
    EXPECT_TRUE(started.ok()) << started.status();
    if (!started.ok()) return exported;
    ObservedJob& job = **started;
    EXPECT_TRUE(job.SubmitAndRun().ok());
    absl::StatusOr<v1::Job> ended = job.WaitForEnd(absl::Seconds(60));
    EXPECT_TRUE(ended.ok()) << ended.status();
    std::vector<int> ports = job.worker_metrics_ports();
    ports.push_back(job.coordinator_metrics_port());
    for (int port : ports) {
      absl::StatusOr<std::string> text = HttpGet(port, "/metrics");
      EXPECT_TRUE(text.ok()) << text.status();
      if (!text.ok()) continue;
      absl::StatusOr<std::vector<Sample>> samples = ParseExposition(*text);
      EXPECT_TRUE(samples.ok()) << samples.status();
      if (!samples.ok()) continue;
      for (const Sample& s : *samples) {
        auto& labels = exported[s.name];
        for (const auto& [k, v] : s.labels) labels[k].insert(v);
      }
    }
    return exported;
  }

  // Checks one query; `where` names it in failures. Returns the metrics it names.
  std::set<std::string> CheckQuery(const std::string& expr, const std::string& where,
                                   const Exported& exported,
                                   const std::set<std::string>& recorded) {
    const PromqlRefs refs = ReadPromql(expr);
    EXPECT_FALSE(refs.metrics.empty()) << where << ": names no metric: " << expr;
    std::set<std::string> labels_in_scope = {"instance", "job"};  // added by the scrape
    for (const std::string& m : refs.metrics) {
      if (recorded.count(m)) {
        labels_in_scope.insert("training_job");  // what every rule aggregates by
        continue;
      }
      auto it = exported.find(m);
      if (it == exported.end()) {
        ADD_FAILURE() << where << ": " << m << " is neither exported by the coordinator or a "
                      << "worker nor recorded by rules.yml: " << expr;
        continue;
      }
      for (const auto& [label, values] : it->second) labels_in_scope.insert(label);
    }
    for (const PromqlSelector& sel : refs.selectors) {
      auto it = exported.find(sel.metric);
      for (const PromqlMatcher& m : sel.matchers) {
        if (recorded.count(sel.metric)) {
          EXPECT_EQ(m.label, "training_job") << where << ": " << sel.metric;
          continue;
        }
        if (it == exported.end()) continue;
        auto label = it->second.find(m.label);
        if (label == it->second.end()) {
          ADD_FAILURE() << where << ": " << sel.metric << " has no label " << m.label << ": "
                        << expr;
          continue;
        }
        if (m.op == "=") {
          EXPECT_TRUE(label->second.count(m.value))
              << where << ": " << sel.metric << "{" << m.label << "} never is \"" << m.value
              << "\"; seen: " << absl::StrJoin(label->second, ", ");
        }
      }
    }
    for (const std::string& g : refs.grouping_labels) {
      EXPECT_TRUE(labels_in_scope.count(g))
          << where << ": groups by " << g << ", which no series of the query has: " << expr;
    }
    return refs.metrics;
  }

  std::string dir_;
};

// Catches: a panel on a metric that does not exist (renamed, misspelt, a worker series on
// the coordinator), a label that is not there (stage="preclip"), a rule on a missing series,
// and a dashboard missing one of the panels the issue asks for.
TEST_F(GrafanaDashboardTest, EveryQueryNamesWhatTheServicesExport) {
  const std::string json = ReadFileOrEmpty(SourceDir() + "/deploy/grafana/trainstep.json");
  ASSERT_FALSE(json.empty()) << "cannot read deploy/grafana/trainstep.json";
  absl::StatusOr<Value> dashboard = ParseJson(json);
  ASSERT_TRUE(dashboard.ok()) << dashboard.status();
  const std::string rules_yaml = ReadFileOrEmpty(SourceDir() + "/deploy/prometheus/rules.yml");
  ASSERT_FALSE(rules_yaml.empty());
  const std::set<std::string> recorded = RecordedNames(rules_yaml);
  EXPECT_EQ(recorded.size(), 2u) << absl::StrJoin(recorded, ", ");

  const Exported exported = ScrapeAfterARun();
  ASSERT_FALSE(HasFailure());
  ASSERT_TRUE(exported.count("trainstep_optimizer_updates_total"));
  ASSERT_TRUE(exported.count("trainstep_worker_micro_steps_total"));
  Exported with_up = exported;
  with_up["up"]["job"] = {"trainstep-coordinator", "trainstep-worker"};  // made by Prometheus
  with_up["up"]["instance"] = {};

  // The rules themselves only use exported series.
  const std::vector<std::string> rule_exprs = RuleExpressions(rules_yaml);
  EXPECT_EQ(rule_exprs.size(), 9u);
  for (const std::string& e : rule_exprs) CheckQuery(e, "rules.yml", with_up, recorded);

  EXPECT_EQ(Str(*dashboard, "uid"), "trainstep");
  EXPECT_FALSE(Str(*dashboard, "title").empty());
  const Value* panels = JsonPath(*dashboard, {"panels"});
  ASSERT_NE(panels, nullptr);
  std::vector<const Value*> all;
  CollectPanels(*panels, &all);

  // Template variables: a Prometheus data source and the training_job selector.
  const Value* vars = JsonPath(*dashboard, {"templating", "list"});
  ASSERT_NE(vars, nullptr);
  std::set<std::string> var_names;
  for (const Value& v : vars->list_value().values()) {
    var_names.insert(Str(v, "name"));
    if (Str(v, "type") != "query") continue;
    const Value* q = JsonPath(v, {"query", "query"});
    const std::string query = q != nullptr ? q->string_value() : Str(v, "query");
    std::smatch m;
    ASSERT_TRUE(std::regex_match(query, m, std::regex(R"(label_values\((\w+),\s*(\w+)\))")))
        << query;
    ASSERT_TRUE(exported.count(m[1])) << query;
    EXPECT_TRUE(exported.at(m[1]).count(m[2])) << query;
  }
  EXPECT_TRUE(var_names.count("datasource") && var_names.count("training_job"));

  std::set<int64_t> ids;
  std::map<std::string, std::vector<std::string>> panels_of_metric;  // metric → panel titles
  std::vector<std::string> exprs;
  for (const Value* p : all) {
    const std::string title = Str(*p, "title");
    const std::string type = Str(*p, "type");
    EXPECT_TRUE(ids.insert(static_cast<int64_t>(JsonPath(*p, {"id"})->number_value())).second)
        << "duplicate panel id at " << title;
    EXPECT_NE(JsonPath(*p, {"gridPos", "w"}), nullptr) << title;
    if (type == "row") continue;
    EXPECT_FALSE(title.empty());
    EXPECT_EQ(Str(*JsonPath(*p, {"datasource"}), "uid"), "${datasource}") << title;
    const Value* targets = JsonPath(*p, {"targets"});
    ASSERT_NE(targets, nullptr) << title;
    ASSERT_GT(targets->list_value().values_size(), 0) << title << " has no query";
    for (const Value& t : targets->list_value().values()) {
      const std::string expr = Str(t, "expr");
      ASSERT_FALSE(expr.empty()) << title;
      exprs.push_back(expr);
      for (const std::string& m :
           CheckQuery(expr, absl::StrCat("panel \"", title, "\""), exported, recorded)) {
        panels_of_metric[m].push_back(title);
      }
    }
  }

  // The panels the issue asks for, found by what they query.
  for (const char* m :
       {"trainstep_tokens_total", "trainstep_optimizer_updates_total", "trainstep_loss",
        "trainstep_loss_scale", "trainstep_learning_rate", "trainstep_grad_norm",
        "training_job:trainstep_windows_skipped:ratio_rate5m",
        "trainstep_window_duration_seconds_bucket", "trainstep_world_size", "trainstep_generation",
        "trainstep_checkpoint_id", "trainstep_update_interval_seconds_bucket",
        "trainstep_micro_step_id", "trainstep_dropped_samples_total", "trainstep_job_goodput_ratio",
        "trainstep_job_lost_seconds", "trainstep_hangs_total"}) {
    EXPECT_TRUE(panels_of_metric.count(m)) << "no panel shows " << m;
  }
  auto some_expr = [&](const std::string& needle) {
    for (const std::string& e : exprs) {
      if (absl::StrContains(e, needle)) return true;
    }
    return false;
  };
  EXPECT_TRUE(some_expr("stage=\"pre_clip\"") && some_expr("stage=\"post_clip\""));
  EXPECT_TRUE(some_expr("stage=\"scaled\""));  // the norm probe
  EXPECT_TRUE(some_expr("histogram_quantile(0.5,") && some_expr("histogram_quantile(0.99,"));
  EXPECT_TRUE(some_expr("rate(trainstep_tokens_total"));
  EXPECT_TRUE(some_expr("rate(trainstep_optimizer_updates_total"));
}

}  // namespace
}  // namespace trainstep::obs
