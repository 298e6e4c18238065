// meta.json: exact round trips and errors that name the field (Torch-free).
#include "worker/checkpoint/checkpoint_meta.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "tests/unit/worker/checkpoint/fixtures.h"

namespace trainstep::ckpt {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

using fixture::MetaFor;

// Catches integers rounded through double and loss scales printed without enough digits.
TEST(CheckpointMetaTest, JsonRoundTripsExtremeValuesExactly) {
  const int64_t kTwo53 = int64_t{1} << 53;
  const std::vector<int64_t> ints = {0,
                                     -1,
                                     kTwo53 - 1,
                                     kTwo53,
                                     kTwo53 + 1,
                                     -kTwo53,
                                     std::numeric_limits<int64_t>::min(),
                                     std::numeric_limits<int64_t>::max()};
  const std::vector<double> scales = {1.0,  65536.0, 0.1, 1.0 / 3, 5e-324, 1.7976931348623157e308,
                                      -0.0, 2.0e-38};
  for (size_t i = 0; i < ints.size(); ++i) {
    CheckpointMeta m = MetaFor(1);
    m.checkpoint_id = m.epoch = m.written_unix_ms = ints[i];
    m.cumulative_tokens = ints[ints.size() - 1 - i];
    m.loss_scale = scales[i];
    m.job_id = "unicode \u2603 tab\t";
    absl::StatusOr<std::string> json = CheckpointMetaToJson(m);
    ASSERT_TRUE(json.ok()) << json.status();
    absl::StatusOr<CheckpointMeta> back = CheckpointMetaFromJson(*json);
    ASSERT_TRUE(back.ok()) << back.status() << "\n" << *json;
    EXPECT_TRUE(*back == m) << *json;
    EXPECT_EQ(std::signbit(back->loss_scale), std::signbit(m.loss_scale));
  }
}

// Catches: a checkpoint of a job with spec.eval losing its last eval loss, a NaN written as
// JSON that nothing can read, or checkpoints of jobs without eval gaining the fields.
TEST(CheckpointMetaTest, EvalLossRoundTripsAndIsAbsentWithoutEval) {
  CheckpointMeta m = MetaFor(4);
  const std::string without = *CheckpointMetaToJson(m);
  EXPECT_THAT(without, Not(HasSubstr("eval")));
  EXPECT_FALSE(CheckpointMetaFromJson(without)->eval_loss.has_value());
  m.eval_loss = 2.0 / 3;
  m.eval_update_id = 40;
  const std::string with = *CheckpointMetaToJson(m);
  EXPECT_THAT(with, HasSubstr("\"eval_update_id\": 40"));
  absl::StatusOr<CheckpointMeta> back = CheckpointMetaFromJson(with);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(*back == m);
  m.eval_loss = std::numeric_limits<double>::quiet_NaN();
  const std::string nan = *CheckpointMetaToJson(m);
  EXPECT_THAT(nan, HasSubstr("\"eval_loss\": null"));
  back = CheckpointMetaFromJson(nan);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(*back == m);
}

// Catches file digests lost, rounded through double, or accepted when they could name a path
// outside the checkpoint or are not the 16 hex digits the writer writes.
TEST(CheckpointMetaTest, FileDigestsRoundTripAndBadOnesNameTheField) {
  CheckpointMeta m = MetaFor(5);
  EXPECT_THAT(*CheckpointMetaToJson(m), Not(HasSubstr("xxh64")));
  m.file_xxh64 = {{"model.safetensors", 0xfedcba9876543210u}, {"optimizer.safetensors", 1}};
  const std::string json = *CheckpointMetaToJson(m);
  EXPECT_THAT(json, HasSubstr("\"model.safetensors\": \"fedcba9876543210\""));
  EXPECT_THAT(json, HasSubstr("\"optimizer.safetensors\": \"0000000000000001\""));
  absl::StatusOr<CheckpointMeta> back = CheckpointMetaFromJson(json);
  ASSERT_TRUE(back.ok()) << back.status() << json;
  EXPECT_TRUE(*back == m);

  for (const std::string& bad : {std::string("\"FEDCBA9876543210\""), std::string("\"fedcba98\""),
                                 std::string("12"), std::string("\"fedcba987654321g\"")}) {
    std::string s = json;
    s.replace(s.find("\"fedcba9876543210\""), 18, bad);
    absl::StatusOr<CheckpointMeta> refused = CheckpointMetaFromJson(s);
    EXPECT_THAT(refused.status().message(), HasSubstr("\"xxh64\" of model.safetensors")) << bad;
  }
  std::string escape = json;
  escape.replace(escape.find("\"optimizer.safetensors\""), 23, "\"../x\"");
  EXPECT_THAT(CheckpointMetaFromJson(escape).status().message(),
              HasSubstr("not a file of the checkpoint"));
  m.file_xxh64 = {{"../x", 1}};
  EXPECT_EQ(CheckpointMetaToJson(m).status().code(), absl::StatusCode::kInvalidArgument);
}

// Catches a meta.json parser that accepts wrong types or missing fields silently.
TEST(CheckpointMetaTest, MalformedMetaJsonNamesTheField) {
  const std::string good = *CheckpointMetaToJson(MetaFor(2));
  const auto replace = [&good](const std::string& from, const std::string& to) {
    std::string s = good;
    const size_t pos = s.find(from);
    EXPECT_NE(pos, std::string::npos) << from;
    return s.replace(pos, from.size(), to);
  };
  struct Case {
    std::string json;
    std::string problem;
  };
  const std::vector<Case> cases = {
      {replace("\"epoch\": 4", "\"epoch\": 4.5"), "\"epoch\" is 4.5"},
      {replace("\"epoch\": 4", "\"epoch\": \"four\""), "\"epoch\" is not an integer"},
      {replace("\"epoch\": 4", "\"epoch\": 1e300"), "\"epoch\" is 1e+300"},
      {replace("\"epoch\": 4,", ""), "\"epoch\" is missing"},
      {replace("\"job_id\": \"job-\\\"7\\\"\"", "\"job_id\": 7"), "\"job_id\" is not a string"},
      {replace("\"loss_scale\": 0.1", "\"loss_scale\": \"0.1\""), "\"loss_scale\" is not a number"},
      {"{\"job_id\": " + std::string(10000, '[') + "}", "nests deeper than 2"},
      {"not json", "not valid JSON"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<CheckpointMeta> m = CheckpointMetaFromJson(c.json);
    ASSERT_FALSE(m.ok()) << c.json;
    EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(m.status().message(), HasSubstr(c.problem));
  }
  CheckpointMeta inf = MetaFor(2);
  inf.loss_scale = std::numeric_limits<double>::infinity();
  EXPECT_EQ(CheckpointMetaToJson(inf).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace trainstep::ckpt
