#include "core/window_plan.h"

#include <algorithm>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainstep {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::IsEmpty;

// micro_batch_size × accumulation_steps × workers.count = 2 × 2 × 2 unless set otherwise.
struct Plan {
  int micro_batch_size = 2;
  int accumulation_steps = 2;
  int workers = 2;
  bool shuffle = false;
  bool drop = false;
  uint64_t seed = 0;

  Plan& Batch(int mbs, int k, int w) {
    micro_batch_size = mbs;
    accumulation_steps = k;
    workers = w;
    return *this;
  }
  Plan& Shuffle(uint64_t s) {
    shuffle = true;
    seed = s;
    return *this;
  }
  Plan& Drop() {
    drop = true;
    return *this;
  }
};

v1::JobSpec Spec(const Plan& p) {
  const std::string json = absl::StrCat(
      R"({"seed":")", p.seed, R"(","model":{"tiny_gpt":{}},"data":{"text":{"paths":["/c"]},)",
      R"("shuffle":)", p.shuffle ? "true" : "false", R"(},"batch":{"micro_batch_size":)",
      p.micro_batch_size, R"(,"accumulation_steps":)", p.accumulation_steps, R"(,"tail":")",
      p.drop ? "drop" : "dynamic", R"("},"workers":{"count":)", p.workers, "}}");
  absl::StatusOr<v1::JobSpec> spec = ParseAndResolveJobSpec(json);
  EXPECT_TRUE(spec.ok()) << spec.status() << "\n" << json;
  return spec.ok() ? *spec : v1::JobSpec();
}

std::vector<int64_t> Range(int64_t begin, int64_t end) {
  std::vector<int64_t> out;
  for (int64_t i = begin; i < end; ++i) out.push_back(i);
  return out;
}

std::vector<int64_t> Flatten(const std::vector<std::vector<int64_t>>& batches) {
  std::vector<int64_t> out;
  for (const auto& b : batches) out.insert(out.end(), b.begin(), b.end());
  return out;
}

// Catches a window count that disagrees with the coordinator's (ceil for dynamic, floor for
// drop) or a global batch that forgot a factor.
TEST(WindowPlannerTest, WindowsPerEpochFollowTailPolicy) {
  const WindowPlanner dynamic(Spec(Plan()), 10);  // B = 2 × 2 × 2 = 8
  EXPECT_EQ(dynamic.global_batch(), 8);
  EXPECT_EQ(dynamic.windows_per_epoch(), 2);
  EXPECT_EQ(WindowPlanner(Spec(Plan().Drop()), 10).windows_per_epoch(), 1);
  EXPECT_EQ(WindowPlanner(Spec(Plan()), 16).windows_per_epoch(), 2);
  EXPECT_EQ(WindowPlanner(Spec(Plan().Drop()), 16).windows_per_epoch(), 2);
  EXPECT_EQ(WindowPlanner(Spec(Plan()), 3).windows_per_epoch(), 1);
  EXPECT_EQ(WindowPlanner(Spec(Plan().Drop()), 3).windows_per_epoch(), 0);
  EXPECT_EQ(WindowsPerEpoch(17, 8, false), 3);
  EXPECT_EQ(WindowsPerEpoch(17, 8, true), 2);
}

// Catches the short last window lost with tail dynamic, or trained with drop; and epochs that
// do not restart the data (window ids continue across epochs).
TEST(WindowPlannerTest, TailWindowAndEpochsWithoutShuffle) {
  const WindowPlanner dynamic(Spec(Plan()), 10);
  EXPECT_THAT(dynamic.WindowSamples(1), ElementsAreArray(Range(0, 8)));
  EXPECT_THAT(dynamic.WindowSamples(2), ElementsAre(8, 9));              // short tail trains
  EXPECT_THAT(dynamic.WindowSamples(3), ElementsAreArray(Range(0, 8)));  // epoch 1
  EXPECT_THAT(dynamic.WindowSamples(4), ElementsAre(8, 9));
  EXPECT_EQ(dynamic.EpochOf(1), 0);
  EXPECT_EQ(dynamic.EpochOf(2), 0);
  EXPECT_EQ(dynamic.EpochOf(3), 1);
  EXPECT_EQ(dynamic.EpochOf(4), 1);
  EXPECT_EQ(dynamic.EpochOf(5), 2);

  const WindowPlanner drop(Spec(Plan().Drop()), 10);
  EXPECT_THAT(drop.WindowSamples(1), ElementsAreArray(Range(0, 8)));
  EXPECT_THAT(drop.WindowSamples(2), ElementsAreArray(Range(0, 8)));  // epoch 1: 8, 9 dropped
  EXPECT_EQ(drop.EpochOf(2), 1);
}

// Catches window sample sets that depend on the world size: for W = 1..4 the ranks' shares,
// together, are exactly the window, each sample once (worker/data's collate test checks that
// their tokens add up to the window's N too).
TEST(WindowPlannerTest, RankSharesPartitionTheWindowForAnyWorldSize) {
  const WindowPlanner plan(Spec(Plan().Batch(3, 2, 2).Shuffle(11)),
                           37);  // B = 12, 4 windows an epoch, the last of 1
  for (int64_t w = 1; w <= 2 * plan.windows_per_epoch(); ++w) {
    std::vector<int64_t> window = plan.WindowSamples(w);
    std::sort(window.begin(), window.end());
    for (int world = 1; world <= 4; ++world) {
      std::vector<int64_t> all;
      for (int rank = 0; rank < world; ++rank) {
        const auto mbs = plan.RankMicroBatches(w, rank, world);
        for (const auto& mb : mbs) {
          EXPECT_GE(mb.size(), 1u);
          EXPECT_LE(mb.size(), 3u);
        }
        const std::vector<int64_t> share = Flatten(mbs);
        all.insert(all.end(), share.begin(), share.end());
      }
      std::sort(all.begin(), all.end());
      EXPECT_EQ(all, window) << "window " << w << ", world size " << world;
    }
  }
}

// Catches a contiguous (blocked) split where a strided one is specified, and micro-batches cut
// out of order.
TEST(WindowPlannerTest, StridedSplitThenMicroBatches) {
  const WindowPlanner plan(Spec(Plan()), 16);  // B = 8
  EXPECT_THAT(plan.RankMicroBatches(1, 0, 2), ElementsAre(ElementsAre(0, 2), ElementsAre(4, 6)));
  EXPECT_THAT(plan.RankMicroBatches(1, 1, 2), ElementsAre(ElementsAre(1, 3), ElementsAre(5, 7)));
  EXPECT_THAT(plan.RankMicroBatches(2, 1, 2), ElementsAre(ElementsAre(9, 11), ElementsAre(13, 15)));
  EXPECT_THAT(plan.RankMicroBatches(1, 2, 3), ElementsAre(ElementsAre(2, 5)));
}

// Catches K ≠ accumulation_steps in a full window (a rank running too few or too many
// micro-steps), each micro-batch full.
TEST(WindowPlannerTest, FullWindowGivesAccumulationStepsMicroBatchesPerRank) {
  for (int k : {1, 3, 4}) {
    for (int world : {1, 2, 3}) {
      const WindowPlanner plan(Spec(Plan().Batch(5, k, world).Shuffle(3)), 1000);
      for (int rank = 0; rank < world; ++rank) {
        const auto mbs = plan.RankMicroBatches(1, rank, world);
        ASSERT_EQ(static_cast<int>(mbs.size()), k) << "K " << k << " W " << world;
        for (const auto& mb : mbs) EXPECT_EQ(mb.size(), 5u);
      }
    }
  }
}

// Catches a crash or a phantom micro-batch for a rank that gets no sample of a short tail
// window.
TEST(WindowPlannerTest, RankWithoutSamplesInShortTailWindow) {
  const WindowPlanner plan(Spec(Plan()), 9);  // B = 8: window 2 holds sample 8 only
  EXPECT_THAT(plan.RankMicroBatches(2, 0, 2), ElementsAre(ElementsAre(8)));
  EXPECT_THAT(plan.RankMicroBatches(2, 1, 2), IsEmpty());
}

// Catches out-of-range ids or ranks returning someone else's data instead of nothing.
TEST(WindowPlannerTest, InvalidArgumentsGiveNothing) {
  const WindowPlanner plan(Spec(Plan()), 10);
  EXPECT_THAT(plan.WindowSamples(0), IsEmpty());
  EXPECT_THAT(plan.WindowSamples(-3), IsEmpty());
  EXPECT_THAT(plan.RankMicroBatches(1, 2, 2), IsEmpty());
  EXPECT_THAT(plan.RankMicroBatches(1, -1, 2), IsEmpty());
  EXPECT_THAT(plan.RankMicroBatches(1, 0, 0), IsEmpty());
  const WindowPlanner none(Spec(Plan().Drop()), 3);
  EXPECT_THAT(none.WindowSamples(1), IsEmpty());
  EXPECT_EQ(none.EpochOf(5), 0);
}

// Catches a shuffle that is not a permutation, repeats every epoch, ignores the seed, or is
// not reproducible by a second planner (another worker).
TEST(WindowPlannerTest, ShuffleIsSeededPermutationPerEpoch) {
  const int64_t n = 100;
  const WindowPlanner a(Spec(Plan().Shuffle(42)), n);
  const WindowPlanner b(Spec(Plan().Shuffle(42)), n);
  const WindowPlanner other(Spec(Plan().Shuffle(43)), n);
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    std::vector<int64_t> order = a.EpochOrder(epoch);
    EXPECT_EQ(order, b.EpochOrder(epoch));
    EXPECT_NE(order, other.EpochOrder(epoch));
    EXPECT_NE(order, Range(0, n));
    // The windows of the epoch visit the order, window after window.
    std::vector<int64_t> visited;
    for (int64_t w = 1; w <= a.windows_per_epoch(); ++w) {
      const std::vector<int64_t> s = a.WindowSamples(epoch * a.windows_per_epoch() + w);
      visited.insert(visited.end(), s.begin(), s.end());
    }
    EXPECT_EQ(visited, order);
    std::sort(order.begin(), order.end());
    EXPECT_EQ(order, Range(0, n));
  }
  EXPECT_NE(a.EpochOrder(0), a.EpochOrder(1));
  EXPECT_NE(a.EpochOrder(1), a.EpochOrder(2));
  EXPECT_EQ(a.EpochOrder(0), a.EpochOrder(0));  // the cache returns the same order again
}

// Catches a platform or library change in the shuffle (std::shuffle, a changed stream):
// the first indices of two epochs are pinned (checked against a Python re-implementation).
TEST(WindowPlannerTest, ShuffleGoldenValues) {
  const WindowPlanner plan(Spec(Plan().Shuffle(42)), 100);
  const std::vector<int64_t> e0 = plan.EpochOrder(0);
  const std::vector<int64_t> e1 = plan.EpochOrder(1);
  EXPECT_THAT(std::vector<int64_t>(e0.begin(), e0.begin() + 8),
              ElementsAre(98, 13, 71, 63, 70, 26, 2, 33));
  EXPECT_THAT(std::vector<int64_t>(e1.begin(), e1.begin() + 8),
              ElementsAre(20, 91, 43, 86, 19, 66, 7, 76));
}

// Catches hidden state (a cursor advanced per call): the same questions asked twice, in any
// order, of two planners give the same answers.
TEST(WindowPlannerTest, PlanIsAPureFunction) {
  const Plan p = Plan().Batch(3, 2, 3).Shuffle(7);
  const WindowPlanner a(Spec(p), 50);
  const WindowPlanner b(Spec(p), 50);
  std::vector<std::vector<std::vector<int64_t>>> first;
  for (int64_t w = 9; w >= 1; --w) {
    for (int rank = 0; rank < 3; ++rank) first.push_back(a.RankMicroBatches(w, rank, 3));
  }
  size_t i = 0;
  for (int64_t w = 9; w >= 1; --w) {
    for (int rank = 0; rank < 3; ++rank) {
      EXPECT_EQ(b.RankMicroBatches(w, rank, 3), first[i]);
      EXPECT_EQ(a.RankMicroBatches(w, rank, 3), first[i]);
      ++i;
    }
  }
}

// Catches: a tail window not flagged (or a full one flagged), the flag under `drop`, the
// epoch end misplaced.
TEST(WindowPlannerTest, WindowSizeMarksTheShortTailWindow) {
  const WindowPlanner dynamic(Spec(Plan()), 19);  // B = 8: windows of 8, 8, 3
  EXPECT_EQ(dynamic.WindowSize(1), 8);
  EXPECT_EQ(dynamic.WindowSize(3), 3);
  EXPECT_EQ(dynamic.WindowSize(6), 3);  // epoch 1
  EXPECT_EQ(dynamic.WindowSize(0), 0);
  for (int64_t w = 1; w <= 6; ++w) {
    EXPECT_EQ(dynamic.IsTailWindow(w), w % 3 == 0) << w;
    EXPECT_EQ(dynamic.EndsEpoch(w), w % 3 == 0) << w;
    EXPECT_EQ(dynamic.WindowSize(w), static_cast<int64_t>(dynamic.WindowSamples(w).size())) << w;
  }
  EXPECT_EQ(dynamic.dropped_per_epoch(), 0);
  EXPECT_EQ(dynamic.DroppedTail(0).samples(), 0);
  EXPECT_TRUE(WindowPlanner(Spec(Plan()), 5).IsTailWindow(1));  // S < B: the only window
  EXPECT_FALSE(WindowPlanner(Spec(Plan()), 16).IsTailWindow(2));

  const WindowPlanner drop(Spec(Plan().Drop()), 19);
  for (int64_t w = 1; w <= 4; ++w) {
    EXPECT_FALSE(drop.IsTailWindow(w)) << w;
    EXPECT_EQ(drop.EndsEpoch(w), w % 2 == 0) << w;
  }
}

// Catches: a dropped tail that names other samples than the ones no window trains (count,
// positions or, shuffled, the indices of another epoch), a tail reported under `dynamic`.
TEST(WindowPlannerTest, DroppedTailIsExactlyWhatNoWindowTrains) {
  for (const Plan& p : {Plan().Drop(), Plan().Drop().Shuffle(5), Plan().Batch(3, 2, 2).Drop()}) {
    const WindowPlanner planner(Spec(p), 45);
    const int64_t per_epoch = planner.windows_per_epoch();
    for (int64_t epoch = 0; epoch < 3; ++epoch) {
      std::set<int64_t> trained;
      for (int64_t w = epoch * per_epoch + 1; w <= (epoch + 1) * per_epoch; ++w) {
        for (int64_t i : planner.WindowSamples(w)) trained.insert(i);
      }
      std::vector<int64_t> left_out;
      const std::vector<int64_t> order = planner.EpochOrder(epoch);
      for (int64_t pos = 0; pos < 45; ++pos) {
        if (trained.count(order[pos]) == 0) left_out.push_back(order[pos]);
      }
      const v1::DroppedTail d = planner.DroppedTail(epoch);
      EXPECT_EQ(d.epoch(), epoch);
      EXPECT_EQ(d.samples(), static_cast<int64_t>(left_out.size()));
      EXPECT_EQ(d.samples(), planner.dropped_per_epoch());
      EXPECT_EQ(d.first_position(), 45 - d.samples());
      EXPECT_THAT(d.sample_ids(), ElementsAreArray(left_out)) << "epoch " << epoch;
    }
  }
  // Two shuffled epochs drop different samples.
  const WindowPlanner shuffled(Spec(Plan().Drop().Shuffle(5)), 45);
  const auto ids = [&](int64_t epoch) {
    const v1::DroppedTail d = shuffled.DroppedTail(epoch);
    return std::vector<int64_t>(d.sample_ids().begin(), d.sample_ids().end());
  };
  EXPECT_NE(ids(0), ids(1));
}

// Catches: a log record that grows with the dataset: beyond the listing limit only the count
// and the positions are given.
TEST(WindowPlannerTest, LargeDroppedTailIsNotListed) {
  const int64_t b = 2 * 2 * 2;
  const int64_t limit = WindowPlanner::kMaxListedDroppedSamples;
  // B = 8 cannot drop more than 7: a bigger batch is needed to pass the limit.
  const WindowPlanner big(Spec(Plan().Batch(4096, 2, 1).Drop().Shuffle(3)), 8192 + limit + 1);
  const v1::DroppedTail d = big.DroppedTail(0);
  EXPECT_EQ(d.samples(), limit + 1);
  EXPECT_EQ(d.first_position(), 8192);
  EXPECT_TRUE(d.sample_ids().empty());
  const WindowPlanner at_limit(Spec(Plan().Batch(4096, 2, 1).Drop().Shuffle(3)), 8192 + limit);
  EXPECT_EQ(at_limit.DroppedTail(0).sample_ids_size(), limit);
  EXPECT_EQ(WindowPlanner(Spec(Plan().Drop()), b * 3).DroppedTail(0).samples(), 0);
}

// Catches: an evaluation set that depends on the world size (the loss would change when a
// worker joins), a sample evaluated twice or never, and max_batches cutting the wrong count.
TEST(EvalMicroBatchesTest, SameSetForEveryWorldSizeWithinMaxBatches) {
  for (int64_t max_batches : {0, 3, 100}) {
    const int64_t expected = max_batches == 3 ? 6 : 11;  // 11 samples, micro-batches of 2
    for (int world : {1, 2, 3, 7}) {
      std::vector<int64_t> seen;
      for (int rank = 0; rank < world; ++rank) {
        for (const std::vector<int64_t>& mb : EvalMicroBatches(11, 2, max_batches, rank, world)) {
          EXPECT_LE(mb.size(), 2u);
          EXPECT_FALSE(mb.empty());
          seen.insert(seen.end(), mb.begin(), mb.end());
        }
      }
      std::sort(seen.begin(), seen.end());
      std::vector<int64_t> all(expected);
      for (int64_t i = 0; i < expected; ++i) all[i] = i;
      EXPECT_EQ(seen, all) << "world " << world << " max_batches " << max_batches;
    }
  }
  // Micro-batch m goes to rank m mod W, in file order.
  EXPECT_EQ(EvalMicroBatches(7, 2, 0, 1, 2), (std::vector<std::vector<int64_t>>{{2, 3}, {6}}));
}

}  // namespace
}  // namespace trainstep
