// The coordinator's stderr log, as a log shipper reads it. With --log-format json every line
// is one JSON object: one per ended window carrying every field of the per-update record
// (plus event and training_job), the others with time, level and msg. With text, lines are
// for people: a timestamp, a level, and one line per ended window.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "tests/observability/observability_util.h"
#include "tests/observability/observed_job.h"

namespace trainstep::obs {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Value;

class StructuredLogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (std::filesystem::temp_directory_path() /
            absl::StrCat("trainstep-log-", getpid(), "-",
                         ::testing::UnitTest::GetInstance()->current_test_info()->name()))
               .string();
  }
  void TearDown() override {
    if (!HasFailure()) std::filesystem::remove_all(dir_);
  }

  // Runs a whole job with the coordinator at `format`, stops the coordinator (so that its
  // log is complete), and returns the log's lines; `log` gets the per-update log.
  std::vector<std::string> RunJob(const std::string& format, std::vector<v1::UpdateRecord>* log) {
    ObservedJobOptions options;
    options.log_format = format;
    options.windows = 30;
    absl::StatusOr<std::unique_ptr<ObservedJob>> started = ObservedJob::Start(dir_, options);
    EXPECT_TRUE(started.ok()) << started.status();
    if (!started.ok()) return {};
    ObservedJob& job = **started;
    EXPECT_TRUE(job.SubmitAndRun().ok());
    absl::StatusOr<v1::Job> ended = job.WaitForEnd(absl::Seconds(60));
    EXPECT_TRUE(ended.ok()) << ended.status();
    absl::StatusOr<std::vector<v1::UpdateRecord>> updates = job.Updates();
    EXPECT_TRUE(updates.ok()) << updates.status();
    if (updates.ok()) *log = *updates;
    job_id_ = job.job_id();
    EXPECT_EQ(job.coordinator().Stop(), 0) << job.Logs();
    return absl::StrSplit(ReadFileOrEmpty(job.coordinator().log_path()), '\n', absl::SkipEmpty());
  }

  std::string dir_;
  std::string job_id_;
};

// Catches: a line that is not JSON (a stray printf, an unescaped quote in a job name), a
// window line missing a record field, a non-finite number written as NaN (not JSON), a
// window logged twice or not at all.
TEST_F(StructuredLogTest, JsonEveryLineParsesAndWindowsCarryTheRecord) {
  std::vector<v1::UpdateRecord> log;
  const std::vector<std::string> lines = RunJob("json", &log);
  ASSERT_FALSE(lines.empty());
  ASSERT_EQ(log.size(), 30u);

  std::map<std::pair<int64_t, int64_t>, Value> windows;  // (generation, window_id) → line
  std::map<int64_t, Value> evals;                        // optimizer_update_id → eval line
  int other_lines = 0;
  int generations = 0;
  for (const std::string& line : lines) {
    absl::StatusOr<Value> v = ParseJson(line);
    ASSERT_TRUE(v.ok()) << v.status();
    ASSERT_TRUE(v->has_struct_value()) << "not an object: " << line;
    const Value* event = JsonPath(*v, {"event"});
    if (event == nullptr) {
      // An ordinary line: when, how bad, what.
      for (const char* key : {"time", "level", "msg"}) {
        const Value* f = JsonPath(*v, {key});
        ASSERT_NE(f, nullptr) << key << " missing in " << line;
        EXPECT_TRUE(f->has_string_value()) << line;
      }
      EXPECT_TRUE(std::regex_match(JsonPath(*v, {"time"})->string_value(),
                                   std::regex(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z)")))
          << line;
      const std::string level = JsonPath(*v, {"level"})->string_value();
      EXPECT_TRUE(level == "INFO" || level == "WARN" || level == "ERROR") << line;
      ++other_lines;
      continue;
    }
    ASSERT_NE(JsonPath(*v, {"training_job"}), nullptr) << line;
    EXPECT_EQ(JsonPath(*v, {"training_job"})->string_value(), job_id_) << line;
    if (event->string_value() == "eval_ended") {  // spec.eval: the held-out loss, after its window
      for (const char* key : {"generation", "optimizer_update_id", "eval_loss", "valid_units"}) {
        ASSERT_NE(JsonPath(*v, {key}), nullptr) << key << " missing in " << line;
      }
      const auto update =
          static_cast<int64_t>(JsonPath(*v, {"optimizer_update_id"})->number_value());
      EXPECT_TRUE(evals.emplace(update, *v).second) << "evaluation logged twice: " << line;
      continue;
    }
    if (event->string_value() == "generation_formed") {  // who trains, and from what state
      for (const char* key : {"generation", "worker_ids", "assignment", "rolled_back"}) {
        ASSERT_NE(JsonPath(*v, {key}), nullptr) << key << " missing in " << line;
      }
      ++generations;
      continue;
    }
    ASSERT_EQ(event->string_value(), "window_ended") << line;
    // Every field of the per-update record, by its .proto name.
    const google::protobuf::Descriptor* d = v1::UpdateRecord::descriptor();
    for (int i = 0; i < d->field_count(); ++i) {
      EXPECT_NE(JsonPath(*v, {d->field(i)->name()}), nullptr)
          << d->field(i)->name() << " missing in " << line;
    }
    const auto key =
        std::make_pair(static_cast<int64_t>(JsonPath(*v, {"generation"})->number_value()),
                       static_cast<int64_t>(JsonPath(*v, {"window_id"})->number_value()));
    EXPECT_TRUE(windows.emplace(key, *v).second) << "window logged twice: " << line;
  }
  EXPECT_GT(other_lines, 0) << "no ordinary lines (listening, submitted, stopped)";
  EXPECT_GT(generations, 0) << "no generation_formed event";

  // One line per record of the per-update log, with the same values; an evaluated record's
  // eval fields are on its eval line (the window line was written before the evaluation).
  ASSERT_EQ(windows.size(), log.size());
  size_t evaluated = 0;
  for (const v1::UpdateRecord& r : log) {
    if (!r.has_eval_loss()) continue;
    ++evaluated;
    auto it = evals.find(r.optimizer_update_id());
    ASSERT_NE(it, evals.end()) << "evaluation of update " << r.optimizer_update_id()
                               << " not logged";
    EXPECT_DOUBLE_EQ(JsonPath(it->second, {"eval_loss"})->number_value(), r.eval_loss());
    EXPECT_EQ(static_cast<int64_t>(JsonPath(it->second, {"valid_units"})->number_value()),
              r.eval_valid_tokens());
  }
  EXPECT_GT(evaluated, 0u) << "the observed job evaluates every 5 updates";
  EXPECT_EQ(evals.size(), evaluated);
  const google::protobuf::Descriptor* d = v1::UpdateRecord::descriptor();
  const google::protobuf::Reflection* refl = v1::UpdateRecord::GetReflection();
  for (const v1::UpdateRecord& r : log) {
    auto it = windows.find({r.generation(), r.window_id()});
    ASSERT_NE(it, windows.end()) << "window " << r.window_id() << " not logged";
    for (int i = 0; i < d->field_count(); ++i) {
      const FieldDescriptor* f = d->field(i);
      if (f->name() == "eval_loss" || f->name() == "eval_valid_tokens") continue;  // above
      const Value* got = JsonPath(it->second, {f->name()});
      ASSERT_NE(got, nullptr);
      if (!f->is_repeated() && f->has_presence() && !refl->HasField(r, f)) {
        EXPECT_TRUE(got->has_null_value()) << f->name() << ": unset must be null";
        continue;
      }
      switch (f->cpp_type()) {
        case FieldDescriptor::CPPTYPE_STRING:
          EXPECT_EQ(got->string_value(), refl->GetString(r, f)) << f->name();
          break;
        case FieldDescriptor::CPPTYPE_DOUBLE: {
          const double want = refl->GetDouble(r, f);
          if (std::isfinite(want)) {
            EXPECT_DOUBLE_EQ(got->number_value(), want)
                << f->name() << " of window " << r.window_id();
          } else {
            EXPECT_TRUE(got->has_null_value()) << f->name() << ": non-finite must be null";
          }
          break;
        }
        case FieldDescriptor::CPPTYPE_INT64:
          EXPECT_EQ(static_cast<int64_t>(got->number_value()), refl->GetInt64(r, f)) << f->name();
          break;
        case FieldDescriptor::CPPTYPE_INT32:
          EXPECT_EQ(static_cast<int32_t>(got->number_value()), refl->GetInt32(r, f)) << f->name();
          break;
        case FieldDescriptor::CPPTYPE_BOOL:
          EXPECT_EQ(got->bool_value(), refl->GetBool(r, f)) << f->name();
          break;
        default:
          break;
      }
    }
  }
}

// Text lines: "2026-11-29T12:00:00.123Z INFO ...", one per ended window among them.
TEST_F(StructuredLogTest, TextLinesAreForPeople) {
  std::vector<v1::UpdateRecord> log;
  const std::vector<std::string> lines = RunJob("text", &log);
  ASSERT_FALSE(lines.empty());
  const std::regex prefix(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (INFO|WARN|ERROR) .+)");
  size_t window_lines = 0;
  for (const std::string& line : lines) {
    EXPECT_TRUE(std::regex_match(line, prefix)) << line;
    EXPECT_FALSE(absl::StartsWith(line, "{")) << line;
    if (absl::StrContains(line, absl::StrCat(" ", job_id_, " window "))) ++window_lines;
  }
  EXPECT_EQ(window_lines, log.size());
  bool saw_skip = false;
  for (const std::string& line : lines) {
    saw_skip |= absl::StrContains(line, ": skip OVERFLOW update=");
  }
  EXPECT_TRUE(saw_skip) << "no human-readable skip line";
}

// A format that does not exist is refused before anything starts.
TEST_F(StructuredLogTest, UnknownFormatIsRefused) {
  const ProcessResult r =
      RunProgram({BinDir() + "/trainstep-coordinator", "--log-format", "xml", "--listen",
                  "127.0.0.1:0", "--metrics-listen", "", "--state-dir", dir_ + "/state"},
                 "", absl::Seconds(30));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_TRUE(absl::StrContains(r.output, "text or json")) << r.output;
}

}  // namespace
}  // namespace trainstep::obs
