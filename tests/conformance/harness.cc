#include "tests/conformance/harness.h"

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/reflection.h"

namespace trainstep::conformance {

namespace pb = google::protobuf;

double RelativeDifference(const Params& actual, const Params& expected) {
  double max_diff = 0.0, max_ref = 0.0;
  for (const auto& [name, want] : expected.values) {
    auto it = actual.values.find(name);
    if (it == actual.values.end() || it->second.size() != want.size()) return INFINITY;
    if (actual.shapes.count(name) && expected.shapes.count(name) &&
        actual.shapes.at(name) != expected.shapes.at(name)) {
      return INFINITY;
    }
    for (size_t i = 0; i < want.size(); ++i) {
      const double d = std::fabs(static_cast<double>(it->second[i]) - want[i]);
      if (std::isnan(d)) return INFINITY;
      max_diff = std::max(max_diff, d);
      max_ref = std::max(max_ref, std::fabs(static_cast<double>(want[i])));
    }
  }
  if (max_ref == 0.0) return max_diff == 0.0 ? 0.0 : INFINITY;
  return max_diff / max_ref;
}

Params Select(const Params& p, const std::vector<std::string>& prefixes, bool keep) {
  Params out;
  for (const auto& [name, v] : p.values) {
    bool match = prefixes.empty();
    for (const std::string& prefix : prefixes) match = match || absl::StartsWith(name, prefix);
    if (match != keep) continue;
    out.values[name] = v;
    if (p.shapes.count(name)) out.shapes[name] = p.shapes.at(name);
  }
  return out;
}

bool BitwiseEqual(const Params& a, const Params& b) {
  if (a.values.size() != b.values.size()) return false;
  for (const auto& [name, v] : a.values) {
    auto it = b.values.find(name);
    if (it == b.values.end() || it->second.size() != v.size()) return false;
    if (std::memcmp(v.data(), it->second.data(), v.size() * sizeof(float)) != 0) return false;
  }
  return true;
}

bool AllDoublesFinite(const pb::Message& m, std::string* bad) {
  const pb::Descriptor* d = m.GetDescriptor();
  const pb::Reflection* r = m.GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const pb::FieldDescriptor* f = d->field(i);
    if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_DOUBLE) {
      if (f->is_repeated()) {
        for (int k = 0; k < r->FieldSize(m, f); ++k) {
          if (!std::isfinite(r->GetRepeatedDouble(m, f, k))) {
            *bad = absl::StrCat(f->full_name(), "[", k, "]");
            return false;
          }
        }
      } else if (!std::isfinite(r->GetDouble(m, f))) {
        *bad = absl::StrCat(f->full_name(), " = ", r->GetDouble(m, f));
        return false;
      }
    } else if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE) {
      if (f->is_repeated()) {
        for (int k = 0; k < r->FieldSize(m, f); ++k) {
          if (!AllDoublesFinite(r->GetRepeatedMessage(m, f, k), bad)) return false;
        }
      } else if (r->HasField(m, f) && !AllDoublesFinite(r->GetMessage(m, f), bad)) {
        return false;
      }
    }
  }
  return true;
}

void WriteFile(const std::string& path, const std::string& content) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << content;
}

std::string Corpus(size_t bytes) {
  static const char kText[] =
      "the quick brown fox jumps over the lazy dog. pack my box with five dozen liquor jugs. "
      "how vexingly quick daft zebras jump! sphinx of black quartz, judge my vow. ";
  std::string out;
  while (out.size() < bytes) out += kText;
  out.resize(bytes);
  return out;
}

std::string JobConfig::Json() const {
  std::vector<std::string> parts;
  parts.push_back(absl::StrCat(R"("name":")", name, R"(")"));
  parts.push_back(absl::StrCat(R"("seed":)", seed));
  parts.push_back(absl::StrCat(R"("model":)", model));
  parts.push_back(absl::StrCat(R"("data":)", data));
  std::string batch = absl::StrCat(R"("batch":{"micro_batch_size":)", micro_batch,
                                   R"(,"accumulation_steps":)", accumulation);
  if (!tail.empty()) absl::StrAppend(&batch, R"(,"tail":")", tail, R"(")");
  parts.push_back(batch + "}");
  parts.push_back(absl::StrCat(R"("precision":")", precision, R"(")"));
  if (!normalization.empty()) {
    parts.push_back(absl::StrCat(R"("loss":{"normalization":")", normalization, R"("})"));
  }
  parts.push_back(absl::StrCat(R"("optimizer":)", optimizer));
  if (!schedule.empty()) parts.push_back(absl::StrCat(R"("schedule":)", schedule));
  if (max_grad_norm.has_value()) {
    parts.push_back(absl::StrCat(R"("clip":{"max_grad_norm":)", *max_grad_norm, "}"));
  }
  if (!loss_scaler.empty()) parts.push_back(absl::StrCat(R"("loss_scaler":)", loss_scaler));
  std::vector<std::string> stop;
  if (max_updates.has_value()) stop.push_back(absl::StrCat(R"("max_updates":)", *max_updates));
  if (epochs.has_value()) stop.push_back(absl::StrCat(R"("epochs":)", *epochs));
  if (!stop.empty()) parts.push_back(absl::StrCat(R"("stop":{)", absl::StrJoin(stop, ","), "}"));
  if (!checkpoint_dir.empty()) {
    parts.push_back(absl::StrCat(R"("checkpoint":{"dir":")", checkpoint_dir,
                                 R"(","every_updates":)", checkpoint_every, R"(,"keep_last":)",
                                 keep_last, "}"));
  }
  parts.push_back(absl::StrCat(R"("workers":{"count":)", workers, "}"));
  if (!eval.empty()) parts.push_back(absl::StrCat(R"("eval":)", eval));
  return absl::StrCat("{", absl::StrJoin(parts, ","), "}");
}

std::vector<std::string> JobConfig::WorkerFlags() const {
  if (nonfinite_windows.empty()) return {};
  return {absl::StrCat("--debug-nonfinite-grad-windows=", absl::StrJoin(nonfinite_windows, ","))};
}

void ConformanceTest::SetUp() {
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  dir_ = absl::StrCat("/tmp/trainstep-conformance-", getpid(), "-", info->test_suite_name(), ".",
                      info->name());
  std::filesystem::remove_all(dir_);
  std::filesystem::create_directories(dir_);
  // Several workers share 2 cores: one intra-op thread each keeps them from thrashing.
  setenv("OMP_NUM_THREADS", "1", /*overwrite=*/0);
}

void ConformanceTest::TearDown() {
  cluster_.reset();
  if (!HasFailure() && getenv("TRAINSTEP_KEEP_TEST_DIRS") == nullptr) {
    std::filesystem::remove_all(dir_);
  } else {
    std::cerr << "kept " << dir_ << " for inspection\n";
  }
}

testing::ProcessCluster* ConformanceTest::cluster() {
  if (cluster_ == nullptr) {
    absl::StatusOr<std::unique_ptr<testing::ProcessCluster>> c =
        testing::ProcessCluster::Start(dir_ + "/cluster");
    EXPECT_TRUE(c.ok()) << c.status();
    if (c.ok()) cluster_ = std::move(*c);
  }
  return cluster_.get();
}

JobRun ConformanceTest::RunJob(const std::string& spec_json, int workers,
                               const std::vector<std::vector<std::string>>& extra_flags,
                               absl::Duration timeout) {
  JobRun run;
  testing::ProcessCluster* c = cluster();
  if (c == nullptr) return run;
  absl::StatusOr<std::string> id = c->Submit(spec_json);
  EXPECT_TRUE(id.ok()) << id.status() << "\nspec: " << spec_json;
  if (!id.ok()) return run;
  run.job_id = *id;
  for (int i = 0; i < workers; ++i) {
    // No /metrics server: stopping it costs a worker ~2 s at exit (civetweb's poll quantum).
    std::vector<std::string> flags = {"--metrics-listen="};
    if (static_cast<size_t>(i) < extra_flags.size()) {
      flags.insert(flags.end(), extra_flags[i].begin(), extra_flags[i].end());
    }
    absl::StatusOr<pid_t> pid = c->StartWorker(*id, flags);
    EXPECT_TRUE(pid.ok()) << pid.status();
  }
  absl::StatusOr<v1::Job> job = c->WaitForJob(*id, timeout);
  EXPECT_TRUE(job.ok()) << job.status();
  if (job.ok()) run.job = *job;
  run.worker_exit_codes = c->WaitForWorkers(absl::Seconds(30));
  absl::StatusOr<std::vector<v1::UpdateRecord>> log = c->Updates(*id);
  EXPECT_TRUE(log.ok()) << log.status();
  if (log.ok()) run.updates = *log;
  return run;
}

std::vector<v1::UpdateRecord> ConformanceTest::Commits(const std::vector<v1::UpdateRecord>& log) {
  std::vector<v1::UpdateRecord> out;
  for (const v1::UpdateRecord& r : log) {
    if (r.outcome() == "commit") out.push_back(r);
  }
  return out;
}

}  // namespace trainstep::conformance
