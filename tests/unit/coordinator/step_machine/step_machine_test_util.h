// Helpers the step machine's test files share (tests/unit/coordinator/step_machine*_test.cc):
// specs with fp16, checkpoints, evaluation, elastic workers or validation, and the status
// accessors. Each test file covers one concept of coordinator/step_machine/.
#ifndef TRAINSTEP_TESTS_UNIT_COORDINATOR_STEP_MACHINE_STEP_MACHINE_TEST_UTIL_H_
#define TRAINSTEP_TESTS_UNIT_COORDINATOR_STEP_MACHINE_STEP_MACHINE_TEST_UTIL_H_

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "tests/unit/coordinator/machine_test_util.h"

namespace trainstep::testing_util {

inline constexpr double kInf = std::numeric_limits<double>::infinity();
inline constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

inline absl::StatusCode CodeOf(const absl::Status& s) { return s.code(); }
template <typename T>
inline absl::StatusCode CodeOf(const absl::StatusOr<T>& s) {
  return s.status().code();
}

inline std::string MessageOf(const absl::Status& s) { return std::string(s.message()); }
template <typename T>
inline std::string MessageOf(const absl::StatusOr<T>& s) {
  return std::string(s.status().message());
}

inline SpecOptions Fp16(double init_scale = 1024, int64_t growth_interval = 1000) {
  SpecOptions o;
  o.precision = "fp16";
  o.loss_scaler =
      absl::StrCat(R"({"init_scale":)", init_scale, R"(,"growth_interval":)", growth_interval, "}");
  return o;
}

inline SpecOptions WithCheckpoints(int64_t every, SpecOptions o = {}) {
  o.checkpoint_dir = "/ckpt";
  o.every_updates = every;
  return o;
}

inline SpecOptions WithEval(int64_t every, SpecOptions o = {}) {
  o.eval_every = every;
  return o;
}

// --- Elastic world size ---

inline SpecOptions Elastic(int count, int min, const std::string& grace) {
  SpecOptions o;
  o.workers = count;
  o.min_workers = min;
  o.join_grace = grace;
  return o;
}

inline std::vector<v1::GenerationFormed> FormedWith(const SimulatedRanks& sim, size_t from,
                                                    int world) {
  std::vector<v1::GenerationFormed> out;
  for (const v1::GenerationFormed& f : sim.FormedSince(from)) {
    if (f.worker_ids_size() == world) out.push_back(f);
  }
  return out;
}

// Three ranks; two are lost after window 1, and the one left begins window 2 alone (its
// barrier passes). Returns the first generation's worker ids.
inline std::vector<std::string> ShrunkToOneInWindow2(SimulatedRanks& sim) {
  const std::vector<std::string> g1 = sim.Start(3);
  sim.RunWindow();
  sim.Lose({g1[1], g1[2]});
  EXPECT_EQ(sim.Ranks().size(), 1u);
  auto begun = sim.Begin(0, 2, 10);
  EXPECT_TRUE(begun.ok() && begun->ready) << begun.status();
  return g1;
}

// --- spec.validate: a suspicious window re-run, its fault attributed ---

inline SpecOptions Validated(const std::string& validate, int workers = 2) {
  SpecOptions o;
  o.workers = workers;
  o.max_updates = 20;
  o.validate = validate;
  return o;
}

// Two ranks' reports with local gradient checksums 100 + rank.
inline std::vector<RankReport> Checksummed(int world = 2) {
  std::vector<RankReport> reports = Reports(world);
  for (int rank = 0; rank < world; ++rank) reports[rank].grad_checksum = 100 + rank;
  return reports;
}

}  // namespace trainstep::testing_util

#endif  // TRAINSTEP_TESTS_UNIT_COORDINATOR_STEP_MACHINE_STEP_MACHINE_TEST_UTIL_H_
