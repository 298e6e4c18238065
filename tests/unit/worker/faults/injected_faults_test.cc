// The injected faults fire exactly where and when they are asked to, and nowhere else: a fault
// that fired on every rank or in every window would turn the protocol tests that use it
// (overflow skips, desync aborts) into tests of something else.
#include "worker/faults/injected_faults.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/time/clock.h"
#include "core/spec.h"
#include "worker/data/collate.h"
#include "worker/train/replica.h"

namespace trainstep {
namespace {

std::unique_ptr<Replica> MlpReplica() {
  absl::StatusOr<v1::JobSpec> spec =
      ParseAndResolveJobSpec(R"({"model":{"mlp":{}},"data":{"synthetic_regression":{}}})");
  EXPECT_TRUE(spec.ok()) << spec.status();
  std::unique_ptr<Replica> r = *Replica::Create(*spec, at::kCPU);
  r->ZeroGrad();  // defined, all zero
  return r;
}

FaultOptions NonfiniteIn(std::vector<int64_t> windows) {
  FaultOptions options;
  options.nonfinite_grad_windows = std::move(windows);
  return options;
}

// Catches: non-finite gradients injected on every rank (the SUM hides which one overflowed)
// or in windows not listed.
TEST(InjectedFaultsTest, NonFiniteOnlyOnRankZeroInListedWindows) {
  const InjectedFaults hooks(NonfiniteIn({3}));
  std::unique_ptr<Replica> r = MlpReplica();
  hooks.BeforeAllReduce(/*window_id=*/2, /*rank=*/0, /*run=*/1, *r);
  hooks.BeforeAllReduce(/*window_id=*/3, /*rank=*/1, /*run=*/1, *r);
  EXPECT_FALSE(r->UnscaleAndNorm(1.0).found_inf);
  hooks.BeforeAllReduce(/*window_id=*/3, /*rank=*/0, /*run=*/1, *r);
  EXPECT_TRUE(r->UnscaleAndNorm(1.0).found_inf);
}

// The worker overlaps a window's all-reduce with backward only where no injection changes the
// gradients first. Catches: an injection the predicate does not announce (it would change a
// gradient after its bucket left, so only rank 0's copy would hold the inf: no overflow seen).
TEST(InjectedFaultsTest, AnnouncesExactlyTheWindowsWhereItChangesGradients) {
  const InjectedFaults hooks(NonfiniteIn({3, 8}));
  for (int64_t window = 1; window <= 9; ++window) {
    for (int32_t rank : {0, 1}) {
      std::unique_ptr<Replica> r = MlpReplica();
      hooks.BeforeAllReduce(window, rank, /*run=*/1, *r);
      EXPECT_EQ(hooks.ChangesGradientsBeforeAllReduce(window, rank),
                r->UnscaleAndNorm(1.0).found_inf)
          << "window " << window << " rank " << rank;
    }
  }
  EXPECT_TRUE(hooks.ChangesGradientsBeforeAllReduce(8, 0));
  EXPECT_FALSE(InjectedFaults(FaultOptions()).ChangesGradientsBeforeAllReduce(1, 0));
}

// The transient faults of spec.validate's tests hit the first run of their window only: a
// re-run must compute the window right, or nothing could be attributed. Catches a flip in
// every run (it would read as bad data), in other windows, or a poison that misses its sample.
TEST(InjectedFaultsTest, FlipsHitTheFirstRunOfTheirWindowOnlyAndPoisonHitsItsSample) {
  FaultOptions options;
  options.flip_grad_window = 4;
  options.flip_loss_window = 6;
  options.poison_sample = 9;
  const InjectedFaults hooks(options);
  for (int32_t run : {1, 2}) {
    std::unique_ptr<Replica> r = MlpReplica();
    hooks.BeforeAllReduce(/*window_id=*/4, /*rank=*/1, run, *r);
    EXPECT_EQ(r->UnscaleAndNorm(1.0).found_inf, run == 1) << "run " << run;
  }
  std::unique_ptr<Replica> r = MlpReplica();
  hooks.BeforeAllReduce(/*window_id=*/5, /*rank=*/1, /*run=*/1, *r);
  EXPECT_FALSE(r->UnscaleAndNorm(1.0).found_inf);
  EXPECT_TRUE(hooks.ChangesGradientsBeforeAllReduce(4, 1));
  EXPECT_TRUE(std::isnan(hooks.AfterMicroSteps(6, 1, 2.5)));
  EXPECT_EQ(hooks.AfterMicroSteps(6, 2, 2.5), 2.5);
  EXPECT_EQ(hooks.AfterMicroSteps(5, 1, 2.5), 2.5);

  // Armed by a file: the next first run flips and consumes it; nothing after.
  FaultOptions armed;
  armed.flip_grad_file = ::testing::TempDir() + "/flip-" + std::to_string(getpid());
  const InjectedFaults by_file(armed);
  std::ofstream(armed.flip_grad_file) << "";
  for (int32_t run : {2, 1, 1}) {
    std::unique_ptr<Replica> f = MlpReplica();
    const bool existed = std::filesystem::exists(armed.flip_grad_file);
    by_file.BeforeAllReduce(/*window_id=*/9, /*rank=*/0, run, *f);
    EXPECT_EQ(f->UnscaleAndNorm(1.0).found_inf, run == 1 && existed) << "run " << run;
  }
  EXPECT_FALSE(std::filesystem::exists(armed.flip_grad_file));

  data::MicroBatch batch;
  batch.rows = batch.samples = 2;
  batch.feature_dim = 3;
  batch.features.assign(6, 0.5f);
  hooks.PoisonSamples({8, 9}, batch);
  for (size_t i = 0; i < batch.features.size(); ++i) {
    EXPECT_EQ(std::isnan(batch.features[i]), i >= 3) << i;  // row 1 (sample 9) only
  }
}

// Catches: the desync nudge applied in the wrong window or not at all.
TEST(InjectedFaultsTest, PerturbOnlyInItsWindow) {
  FaultOptions options;
  options.perturb_grad_window = 5;
  const InjectedFaults hooks(options);
  std::unique_ptr<Replica> r = MlpReplica();
  hooks.AfterAllReduce(/*window_id=*/4, /*loss_scale=*/1.0, *r);
  EXPECT_EQ(r->UnscaleAndNorm(1.0).grad_norm, 0.0);
  hooks.AfterAllReduce(/*window_id=*/5, /*loss_scale=*/1.0, *r);
  EXPECT_GT(r->UnscaleAndNorm(1.0).grad_norm, 0.0);
}

// Catches: --debug-exit-in-eval exiting in another update's evaluation (or with another code).
TEST(InjectedFaultsTest, ExitOnlyInItsUpdate) {
  FaultOptions options;
  options.exit_in_eval_update = 7;
  const InjectedFaults hooks(options);
  hooks.InEval(6);  // returns
  EXPECT_EXIT(hooks.InEval(7), testing::ExitedWithCode(3), "exiting in the evaluation of update 7");
}

// Catches: a held window that starts while the file exists (the elastic test that uses it would
// race the job's end again), or one held when no file is named or it is gone.
TEST(InjectedFaultsTest, HoldsTheWindowWhileItsFileExists) {
  InjectedFaults(FaultOptions()).BeforeWindow(1);  // no file named: returns
  FaultOptions options;
  options.hold_file = ::testing::TempDir() + "/trainstep-hold-" + std::to_string(getpid());
  std::filesystem::remove(options.hold_file);
  const InjectedFaults hooks(options);
  hooks.BeforeWindow(1);  // no such file: returns
  std::ofstream(options.hold_file) << "hold\n";
  const absl::Time start = absl::Now();
  std::thread release([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    std::filesystem::remove(options.hold_file);
  });
  hooks.BeforeWindow(2);
  const absl::Duration held = absl::Now() - start;
  release.join();
  EXPECT_GE(held, absl::Milliseconds(300));
  EXPECT_LT(held, InjectedFaults::kMaxHold);
}

}  // namespace
}  // namespace trainstep
