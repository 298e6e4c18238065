#include "worker/data/collate.h"

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "core/spec.h"
#include "core/window_plan.h"
#include "gtest/gtest.h"
#include "worker/data/dataset.h"

namespace trainstep::data {
namespace {

// Catches a global token count N that depends on the world size: for W = 1..4 the valid tokens
// the ranks collate from their shares of a window add up to the window's N (ValidTokens), with
// ignored labels and samples of every length.
TEST(CollateTest, RankSharesCarryTheWindowsTokensForAnyWorldSize) {
  std::vector<Sample> samples;
  for (int i = 0; i < 37; ++i) {
    Sample s;
    s.input_ids.assign(1 + (i * 7) % 11, 1);
    s.labels = s.input_ids;
    if (i % 5 == 0) s.labels[s.labels.size() / 2] = -100;
    samples.push_back(s);
  }
  const Dataset data = Dataset::FromSamples(samples);
  const absl::StatusOr<v1::JobSpec> spec = ParseAndResolveJobSpec(
      R"({"seed":"11","model":{"tiny_gpt":{}},"data":{"text":{"paths":["/c"]},"shuffle":true},)"
      R"("batch":{"micro_batch_size":3,"accumulation_steps":2},"workers":{"count":2}})");
  ASSERT_TRUE(spec.ok()) << spec.status();
  const WindowPlanner plan(*spec, data.size());  // B = 12, 4 windows an epoch, the last of 1
  int64_t all_windows_tokens = 0;
  for (int64_t w = 1; w <= 2 * plan.windows_per_epoch(); ++w) {
    const int64_t window_tokens = ValidTokens(data, plan.WindowSamples(w));
    all_windows_tokens += window_tokens;
    for (int world = 1; world <= 4; ++world) {
      int64_t tokens = 0;
      for (int rank = 0; rank < world; ++rank) {
        for (const auto& mb : plan.RankMicroBatches(w, rank, world)) {
          tokens += Collate(data, mb).valid_tokens;
        }
      }
      EXPECT_EQ(tokens, window_tokens) << "window " << w << ", world size " << world;
    }
  }
  EXPECT_GT(all_windows_tokens, 0);  // (a tail window of one 1-token sample has none)
}

}  // namespace
}  // namespace trainstep::data
