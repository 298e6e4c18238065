// The conformance suite's plumbing, Torch-free so the test files compile in seconds: job
// specs built from a few knobs, a fixture that runs jobs on a real ProcessCluster (the
// coordinator binary and trainstep-worker processes on 127.0.0.1), and parameter sets
// compared the one way the suite compares them: max|a − b| / max|b|.
#ifndef TRAINSTEP_TESTS_CONFORMANCE_HARNESS_H_
#define TRAINSTEP_TESTS_CONFORMANCE_HARNESS_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "google/protobuf/message.h"
#include "tests/integration/process_cluster.h"
#include "trainstep/v1/types.pb.h"

namespace trainstep::conformance {

// Named float32 tensors, flattened: model parameters from a checkpoint or from the reference.
struct Params {
  std::map<std::string, std::vector<float>> values;
  std::map<std::string, std::vector<int64_t>> shapes;
};

// max over every tensor of `expected` of |actual − expected|, divided by max |expected|.
// Infinity when `actual` lacks a tensor of `expected` or its shape differs (a NaN counts as
// infinitely far).
double RelativeDifference(const Params& actual, const Params& expected);
// Only the tensors whose name starts with one of `prefixes` (all when empty).
Params Select(const Params& p, const std::vector<std::string>& prefixes, bool keep = true);
// Every byte of every selected tensor equal.
bool BitwiseEqual(const Params& a, const Params& b);

// Every double field of `m`, recursively, is finite; `bad` gets the first that is not.
bool AllDoublesFinite(const google::protobuf::Message& m, std::string* bad);

// Writes `content` to `path` (test data).
void WriteFile(const std::string& path, const std::string& content);
// `bytes` bytes of English-like text (a few sentences repeated): byte-level LM data.
std::string Corpus(size_t bytes);

// A job spec from a few knobs; Json() is what both the cluster and the reference read.
struct JobConfig {
  std::string name = "conformance";
  uint64_t seed = 11;
  std::string model = R"({"mlp":{"hidden":16}})";  // JSON of trainstep.v1.Model
  std::string data = R"({"synthetic_regression":{"samples":72,"in_features":4}})";
  int workers = 1;
  int micro_batch = 4;
  int accumulation = 1;
  std::string tail;  // "" (default dynamic) | "dynamic" | "drop"
  std::string precision = "fp32";
  std::string normalization;  // "" = the data's default (tokens / samples)
  std::string optimizer = R"({"sgd":{"lr":0.1,"momentum":0.9,"weight_decay":0.01}})";
  std::string schedule;  // "" = constant; else JSON of trainstep.v1.Schedule
  std::optional<double> max_grad_norm;
  std::string loss_scaler;  // "" = default; else JSON of trainstep.v1.LossScaler
  std::optional<int64_t> max_updates;
  std::optional<int64_t> epochs;
  std::string checkpoint_dir;  // "" = none
  int64_t checkpoint_every = 1000;
  int keep_last = 0;
  // Windows whose gradient overflows on rank 0: a fault of the testing worker, not of the spec.
  std::vector<int64_t> nonfinite_windows;
  std::string eval;  // "" = none; else JSON of trainstep.v1.Eval

  std::string Json() const;
  // Every worker's flags: the faults above (which start the testing build of the worker).
  std::vector<std::string> WorkerFlags() const;
};

struct JobRun {
  std::string job_id;
  v1::Job job;
  std::vector<v1::UpdateRecord> updates;
  std::vector<int> worker_exit_codes;
};

// Per test: a temp dir /tmp/trainstep-conformance-<pid>-<test> (deleted on success, kept on
// failure or with TRAINSTEP_KEEP_TEST_DIRS) and one coordinator process, started on first
// use, that runs any number of jobs one after another.
class ConformanceTest : public ::testing::Test {
 protected:
  void SetUp() override;
  void TearDown() override;

  const std::string& dir() const { return dir_; }
  testing::ProcessCluster* cluster();
  // Submits `spec_json`, starts `workers` worker processes for it (worker i gets
  // extra_flags[i] when given), waits for the job to end and for its workers to exit.
  // Test assertions fail (non-fatally) on any RPC or process error.
  JobRun RunJob(const std::string& spec_json, int workers,
                const std::vector<std::vector<std::string>>& extra_flags = {},
                absl::Duration timeout = absl::Seconds(120));
  JobRun RunJob(const JobConfig& config) {
    return RunJob(config.Json(), config.workers,
                  std::vector<std::vector<std::string>>(config.workers, config.WorkerFlags()));
  }
  // The committed records of a log, in order.
  static std::vector<v1::UpdateRecord> Commits(const std::vector<v1::UpdateRecord>& log);

 private:
  std::string dir_;
  std::unique_ptr<testing::ProcessCluster> cluster_;
};

}  // namespace trainstep::conformance

#endif  // TRAINSTEP_TESTS_CONFORMANCE_HARNESS_H_
