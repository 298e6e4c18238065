// StepMachine tests: The decision of a window (coordinator/step_machine/decision.cc).
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "coordinator/step_machine.h"
#include "gmock/gmock.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "gtest/gtest.h"
#include "tests/unit/coordinator/step_machine/step_machine_test_util.h"

namespace trainstep {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing_util::CodeOf;
using testing_util::Fp16;
using testing_util::kInf;
using testing_util::kNaN;
using testing_util::RankReport;
using testing_util::Reports;
using testing_util::ResolvedSpec;
using testing_util::SimulatedRanks;
using testing_util::SpecOptions;
using testing_util::WithCheckpoints;

// Every double in `m` (recursively) is finite.
void ExpectAllFinite(const google::protobuf::Message& m, const std::string& path = "") {
  using google::protobuf::FieldDescriptor;
  const google::protobuf::Descriptor* d = m.GetDescriptor();
  const google::protobuf::Reflection* r = m.GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    if (f->is_repeated()) continue;
    if (f->cpp_type() == FieldDescriptor::CPPTYPE_DOUBLE) {
      EXPECT_TRUE(std::isfinite(r->GetDouble(m, f))) << path << f->name();
    } else if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE && r->HasField(m, f)) {
      ExpectAllFinite(r->GetMessage(m, f), path + f->name() + ".");
    }
  }
}

// Catches: clipping without max_grad_norm, a coefficient above 1, or a missing epsilon.
TEST(ClipCoefficientTest, MinOfOneAndMaxOverNorm) {
  EXPECT_EQ(ClipCoefficient(std::nullopt, 1e9), 1.0);
  EXPECT_EQ(ClipCoefficient(1.0, 0.5), 1.0);
  EXPECT_EQ(ClipCoefficient(1.0, 0.0), 1.0);
  EXPECT_EQ(ClipCoefficient(1.0, 2.0), 1.0 / (2.0 + 1e-6));
  EXPECT_EQ(ClipCoefficient(0.5, 10.0), 0.5 / (10.0 + 1e-6));
  // Right at max_norm the epsilon makes the coefficient just under 1, as torch's clip does.
  EXPECT_LT(ClipCoefficient(1.0, 1.0), 1.0);
  EXPECT_EQ(ClipCoefficient(1.0, kInf), 0.0);
}

// Catches: an absolute (not relative) tolerance, a tolerance other than 1e-6, or an
// asymmetric comparison.
TEST(GradNormsAgreeTest, RelativeTolerance) {
  EXPECT_TRUE(GradNormsAgree(0.0, 0.0));
  EXPECT_TRUE(GradNormsAgree(1.0, 1.0 + 0.5e-6));
  EXPECT_TRUE(GradNormsAgree(1.0 + 0.5e-6, 1.0));
  EXPECT_FALSE(GradNormsAgree(1.0, 1.0 + 2e-6));
  EXPECT_FALSE(GradNormsAgree(1.0 + 2e-6, 1.0));
  EXPECT_TRUE(GradNormsAgree(1000.0, 1000.0005));  // 5e-7 relative
  EXPECT_FALSE(GradNormsAgree(1000.0, 1000.01));   // 1e-5 relative
  EXPECT_FALSE(GradNormsAgree(1e-9, 2e-9));        // tiny but twice as large: not the same
  EXPECT_TRUE(GradNormsAgree(kInf, kInf));
  EXPECT_FALSE(GradNormsAgree(1.0, kInf));
}

// Catches: ids that do not advance together on COMMIT (update id, scheduler step,
// cumulative tokens, checkpoint assignment), a wrong clip coefficient, or a wrong record.
TEST(StepMachineTest, CommitAdvancesIdsTogether) {
  SpecOptions o = WithCheckpoints(2);
  o.max_grad_norm = 1.0;
  SimulatedRanks sim(ResolvedSpec(o));
  sim.Start(2);
  sim.Advance(absl::Seconds(3));

  const v1::WindowDecision d1 =
      sim.RunWindow({{10, 10, false, 0.5, 2, 1}, {10, 10, false, 0.5, 2, 1}});
  EXPECT_EQ(d1.outcome(), v1::COMMIT);
  EXPECT_EQ(d1.reason(), "");
  EXPECT_EQ(d1.optimizer_update_id(), 1);
  EXPECT_EQ(d1.scheduler_step(), 1);
  EXPECT_EQ(d1.clip_coef(), 1.0);
  EXPECT_DOUBLE_EQ(d1.learning_rate(), 0.1);
  EXPECT_FALSE(d1.write_checkpoint());
  EXPECT_FALSE(d1.job_done());
  const v1::UpdateRecord& r1 = d1.record();
  EXPECT_EQ(r1.window_id(), 1);
  EXPECT_EQ(r1.generation(), 1);
  EXPECT_EQ(r1.world_size(), 2);
  EXPECT_EQ(r1.outcome(), "commit");
  EXPECT_EQ(r1.optimizer_update_id(), 1);
  EXPECT_EQ(r1.scheduler_step(), 1);
  EXPECT_EQ(r1.micro_steps(), 4);
  EXPECT_EQ(r1.global_valid_tokens(), 20);
  EXPECT_EQ(r1.cumulative_tokens(), 20);
  EXPECT_DOUBLE_EQ(r1.loss(), 1.0);
  EXPECT_EQ(r1.loss_scale(), 1.0);
  EXPECT_EQ(r1.grad_norm_pre_clip(), 0.5);
  EXPECT_EQ(r1.grad_norm_post_clip(), 0.5);
  EXPECT_EQ(r1.clip_coef(), 1.0);
  EXPECT_EQ(r1.checkpoint_id(), 0);
  EXPECT_EQ(r1.epoch(), 0);
  EXPECT_EQ(r1.allreduce_calls(), 1);
  EXPECT_EQ(r1.end_time_ms(), absl::ToUnixMillis(sim.now()));

  const v1::WindowDecision d2 = sim.RunWindow({{3, 5, false, 4.0, 1, 1}, {2, 5, false, 4.0, 1, 1}});
  EXPECT_EQ(d2.outcome(), v1::COMMIT);
  EXPECT_EQ(d2.optimizer_update_id(), 2);
  EXPECT_EQ(d2.scheduler_step(), 2);
  EXPECT_DOUBLE_EQ(d2.clip_coef(), 1.0 / (4.0 + 1e-6));
  EXPECT_NEAR(d2.record().grad_norm_post_clip(), 1.0, 1e-6);
  EXPECT_TRUE(d2.write_checkpoint());  // every_updates 2
  EXPECT_EQ(d2.checkpoint_id(), 1);
  EXPECT_EQ(d2.record().checkpoint_id(), 1);
  EXPECT_EQ(d2.record().cumulative_tokens(), 30);
  EXPECT_DOUBLE_EQ(d2.record().loss(), 0.5);

  const v1::WindowDecision d3 = sim.RunWindow();
  EXPECT_FALSE(d3.write_checkpoint());
  EXPECT_EQ(d3.record().checkpoint_id(), 1);  // the latest assigned so far
  const v1::WindowDecision d4 = sim.RunWindow();
  EXPECT_TRUE(d4.write_checkpoint());
  EXPECT_EQ(d4.checkpoint_id(), 2);

  const v1::JobProgress p = sim.progress();
  EXPECT_EQ(p.window_id(), 4);
  EXPECT_EQ(p.optimizer_update_id(), 4);
  EXPECT_EQ(p.scheduler_step(), 4);
  EXPECT_EQ(p.checkpoint_id(), 2);
  EXPECT_EQ(p.durable_checkpoint_id(), -1);
  EXPECT_EQ(p.cumulative_tokens(), 70);
  EXPECT_EQ(p.windows_committed(), 4);
  EXPECT_EQ(p.windows_skipped(), 0);
  EXPECT_EQ(p.windows_aborted(), 0);
  EXPECT_DOUBLE_EQ(p.last_loss(), 1.0);
  ASSERT_EQ(sim.machine().updates().size(), 4u);
  EXPECT_EQ(sim.machine().updates()[1].SerializeAsString(), d2.record().SerializeAsString());
}

// Catches: an overflow window that advances update id / scheduler / tokens / checkpoints, a
// scale not backed off, or backed off more than once (docs/numerics.md, rule 10 and the last
// worked example).
TEST(StepMachineTest, OverflowSkipsAndBacksOffOnce) {
  SimulatedRanks sim(ResolvedSpec(WithCheckpoints(1, Fp16(1024))));
  sim.Start(2);
  ASSERT_EQ(sim.RunWindow().outcome(), v1::COMMIT);
  RankReport inf;
  inf.found_inf = true;
  inf.grad_norm = kInf;
  const v1::WindowDecision d = sim.RunWindow(Reports(2, inf));
  EXPECT_EQ(d.outcome(), v1::SKIP);
  EXPECT_EQ(d.reason(), "OVERFLOW");
  EXPECT_EQ(d.optimizer_update_id(), 1);
  EXPECT_EQ(d.scheduler_step(), 1);
  EXPECT_FALSE(d.write_checkpoint());
  EXPECT_EQ(d.record().outcome(), "skip");
  EXPECT_EQ(d.record().window_id(), 2);
  EXPECT_EQ(d.record().loss_scale(), 512);
  EXPECT_EQ(d.record().cumulative_tokens(), 20);
  EXPECT_EQ(d.record().grad_norm_post_clip(), 0.0);
  EXPECT_EQ(d.record().checkpoint_id(), 1);
  const v1::JobProgress p = sim.progress();
  EXPECT_EQ(p.window_id(), 2);
  EXPECT_EQ(p.optimizer_update_id(), 1);
  EXPECT_EQ(p.scheduler_step(), 1);
  EXPECT_EQ(p.checkpoint_id(), 1);
  EXPECT_EQ(p.cumulative_tokens(), 20);
  EXPECT_EQ(p.loss_scale(), 512);
  EXPECT_EQ(p.windows_skipped(), 1);
  // The next window runs with the backed-off scale.
  EXPECT_EQ(sim.BeginAll(3, {10, 10}).loss_scale(), 512);
}

// Catches: bf16 (or fp32) running with a scale other than 1, or an overflow that changes
// a disabled scaler (docs/numerics.md, rule 12).
TEST(StepMachineTest, Bf16RunsWithoutScaler) {
  SpecOptions o;
  o.precision = "bf16";
  SimulatedRanks sim(ResolvedSpec(o));
  sim.Start(2);
  EXPECT_EQ(sim.BeginAll(1, {10, 10}).loss_scale(), 1.0);
  RankReport inf;
  inf.found_inf = true;
  const v1::WindowDecision d = sim.CompleteAll(1, Reports(2, inf));
  EXPECT_EQ(d.reason(), "OVERFLOW");
  EXPECT_EQ(d.record().loss_scale(), 1.0);
  EXPECT_EQ(sim.progress().loss_scale(), 1.0);
  EXPECT_EQ(sim.BeginAll(2, {10, 10}).loss_scale(), 1.0);
}

// Catches: a micro_step_id that counts only the window (not cumulative), counts an aborted
// attempt whose micro-batches the retry runs again, or misses a skipped window's.
TEST(StepMachineTest, MicroStepIdCountsEndedWindowsNotAbortedAttempts) {
  SimulatedRanks sim(ResolvedSpec(Fp16(1024)));
  sim.Start(2);
  const v1::WindowDecision d1 = sim.RunWindow();  // 2 ranks × 2 micro-steps
  EXPECT_EQ(d1.record().micro_steps(), 4);
  EXPECT_EQ(d1.record().micro_step_id(), 4);
  RankReport inf;
  inf.found_inf = true;
  inf.micro_steps = 3;
  const v1::WindowDecision d2 = sim.RunWindow(Reports(2, inf));
  ASSERT_EQ(d2.reason(), "OVERFLOW");
  EXPECT_EQ(d2.record().micro_step_id(), 10);
  RankReport diverged;
  diverged.grad_norm = 7.0;
  const v1::WindowDecision d3 = sim.RunWindow({RankReport{}, diverged});
  ASSERT_EQ(d3.reason(), "DESYNC");
  EXPECT_EQ(d3.record().micro_steps(), 4);
  EXPECT_EQ(d3.record().micro_step_id(), 10);  // not counted: retried below
  EXPECT_EQ(sim.progress().micro_step_id(), 10);
  const v1::WindowDecision retry = sim.RunWindow();
  EXPECT_EQ(retry.record().window_id(), 3);
  EXPECT_EQ(retry.record().micro_step_id(), 14);
  // An empty window ends at its barrier: nothing ran.
  sim.BeginAll(4, {0, 0});
  auto empty = sim.Begin(0, 4, 0);
  ASSERT_TRUE(empty.ok() && empty->ready);
  EXPECT_EQ(empty->response.decision().record().micro_step_id(), 14);
  EXPECT_EQ(sim.progress().micro_step_id(), 14);
}

// Catches: an update interval measured per window (first report to decision) instead of
// from one commit to the next, set on skips, or counted from the skip before it.
TEST(StepMachineTest, UpdateIntervalRunsFromThePreviousCommit) {
  SimulatedRanks sim(ResolvedSpec(Fp16(1024)));
  sim.Start(2);  // the job starts running now
  sim.Advance(absl::Milliseconds(700));
  const v1::WindowDecision d1 = sim.RunWindow();
  EXPECT_DOUBLE_EQ(d1.record().update_interval_seconds(), 0.7);  // from the job's start
  sim.Advance(absl::Seconds(2));
  RankReport inf;
  inf.found_inf = true;
  const v1::WindowDecision skipped = sim.RunWindow(Reports(2, inf));
  EXPECT_FALSE(skipped.record().has_update_interval_seconds());
  sim.Advance(absl::Milliseconds(1500));
  ASSERT_FALSE(sim.Begin(0, 3, 10)->ready);
  sim.Advance(absl::Seconds(1));
  sim.Begin(1, 3, 10);
  const v1::WindowDecision d3 = sim.CompleteAll(3, Reports(2));
  EXPECT_DOUBLE_EQ(d3.record().update_interval_seconds(), 4.5);
  EXPECT_DOUBLE_EQ(d3.record().window_seconds(), 1.0);
}

// Catches: the short last window of an epoch not marked, a full window marked, a dropped
// tail not recorded (or recorded under `dynamic`, or on a window that does not end an
// epoch), job progress that forgets the dropped samples.
TEST(StepMachineTest, TailWindowsAndDroppedTailsAreRecorded) {
  SpecOptions o;  // B = 1 × 2 × 2 = 4
  o.epochs = 2;
  {
    SimulatedRanks sim(ResolvedSpec(o));
    sim.set_samples(10);  // windows of 4, 4, 2 per epoch
    sim.Start(2);
    for (int64_t w = 1; w <= 6; ++w) {
      const v1::UpdateRecord r = sim.RunWindow().record();
      EXPECT_EQ(r.tail_window(), w % 3 == 0) << w;
      EXPECT_FALSE(r.has_dropped_tail()) << w;
    }
    EXPECT_EQ(sim.progress().dropped_samples(), 0);
    EXPECT_FALSE(sim.progress().has_last_dropped_tail());
  }
  o.tail = "drop";
  SimulatedRanks sim(ResolvedSpec(o));
  sim.set_samples(10);  // windows of 4, 4; positions 8 and 9 are dropped
  sim.Start(2);
  const v1::UpdateRecord r1 = sim.RunWindow().record();
  EXPECT_FALSE(r1.tail_window());
  EXPECT_FALSE(r1.has_dropped_tail());
  EXPECT_EQ(sim.progress().dropped_samples(), 0);
  const v1::UpdateRecord r2 = sim.RunWindow().record();
  ASSERT_TRUE(r2.has_dropped_tail());
  EXPECT_EQ(r2.dropped_tail().epoch(), 0);
  EXPECT_EQ(r2.dropped_tail().samples(), 2);
  EXPECT_EQ(r2.dropped_tail().first_position(), 8);
  EXPECT_THAT(r2.dropped_tail().sample_ids(), ElementsAre(8, 9));
  EXPECT_EQ(sim.progress().dropped_samples(), 2);
  EXPECT_EQ(sim.progress().last_dropped_tail().SerializeAsString(),
            r2.dropped_tail().SerializeAsString());
  sim.RunWindow();
  // The epoch ends on a skipped window: its tail is dropped all the same.
  RankReport inf;
  inf.found_inf = true;
  const v1::UpdateRecord r4 = sim.RunWindow(Reports(2, inf)).record();
  ASSERT_EQ(r4.outcome(), "skip");
  ASSERT_TRUE(r4.has_dropped_tail());
  EXPECT_EQ(r4.dropped_tail().epoch(), 1);
  EXPECT_EQ(sim.progress().dropped_samples(), 4);
  EXPECT_EQ(sim.progress().last_dropped_tail().epoch(), 1);
}

// Catches: the scaled-norm probe lost between the workers' reports and the log, or made up
// when no scaler reported one.
TEST(StepMachineTest, ScaledGradNormIsLoggedBesideThePreClipNorm) {
  SimulatedRanks sim(ResolvedSpec(Fp16(1024)));
  sim.Start(2);
  RankReport r;
  r.grad_norm = 0.5;
  r.grad_norm_scaled = 512.0;
  const v1::UpdateRecord scaled = sim.RunWindow(Reports(2, r)).record();
  ASSERT_TRUE(scaled.has_grad_norm_scaled());
  EXPECT_EQ(scaled.grad_norm_scaled(), 512.0);
  EXPECT_EQ(scaled.grad_norm_pre_clip(), 0.5);
  EXPECT_FALSE(sim.RunWindow().record().has_grad_norm_scaled());
}

// Catches: an N = 0 window that reaches the workers (or commits) instead of ending at the
// begin barrier as SKIP EMPTY_WINDOW, or that writes a NaN (0/0) anywhere in its record.
TEST(StepMachineTest, EmptyWindowSkipsAtTheBarrier) {
  SimulatedRanks sim(ResolvedSpec(Fp16(1024)));
  sim.Start(2);
  auto a = sim.Begin(0, 1, 0);
  ASSERT_TRUE(a.ok());
  EXPECT_FALSE(a->ready);
  a = sim.Begin(1, 1, 0);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(a->ready);
  EXPECT_EQ(a->response.global_valid_units(), 0);
  ASSERT_TRUE(a->response.has_decision());
  const v1::WindowDecision d = a->response.decision();
  EXPECT_EQ(d.outcome(), v1::SKIP);
  EXPECT_EQ(d.reason(), "EMPTY_WINDOW");
  EXPECT_EQ(d.optimizer_update_id(), 0);
  EXPECT_EQ(d.scheduler_step(), 0);
  EXPECT_EQ(d.record().window_id(), 1);
  EXPECT_EQ(d.record().global_valid_tokens(), 0);
  EXPECT_EQ(d.record().loss(), 0.0);
  EXPECT_EQ(d.record().loss_scale(), 1024);  // not an overflow: no backoff
  ExpectAllFinite(d);

  // Rank 0 asks again and gets the same answer, from both barriers.
  const std::string first_answer = a->response.SerializeAsString();
  a = sim.Begin(0, 1, 0);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(a->ready);
  EXPECT_EQ(a->response.decision().SerializeAsString(), d.SerializeAsString());
  EXPECT_EQ(a->response.SerializeAsString(), first_answer);
  auto c = sim.Complete(0, 1, RankReport{0, 0, false, 0, 0, 0});
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(c->ready);
  EXPECT_EQ(c->response.decision().SerializeAsString(), d.SerializeAsString());

  const v1::JobProgress p = sim.progress();
  EXPECT_EQ(p.window_id(), 1);
  EXPECT_EQ(p.windows_skipped(), 1);
  EXPECT_EQ(p.optimizer_update_id(), 0);
  EXPECT_EQ(p.loss_scale(), 1024);
  ExpectAllFinite(sim.job());
  EXPECT_EQ(sim.RunWindow().outcome(), v1::COMMIT);
  EXPECT_EQ(sim.progress().window_id(), 2);
}

// Catches: a prefetched empty window that is never decided (its barrier completed while
// the previous window was still open, so nobody asks again in time).
TEST(StepMachineTest, PrefetchedEmptyWindowEndsWhenPreviousWindowEnds) {
  SimulatedRanks sim(ResolvedSpec({}));
  sim.Start(2);
  sim.BeginAll(1, {10, 10});
  for (int rank = 0; rank < 2; ++rank) {
    auto a = sim.Begin(rank, 2, 0);
    ASSERT_TRUE(a.ok());
    EXPECT_FALSE(a->ready);
  }
  ASSERT_EQ(sim.CompleteAll(1, Reports(2)).outcome(), v1::COMMIT);
  EXPECT_EQ(sim.progress().window_id(), 2);  // window 2 ended with window 1's decision
  auto a = sim.Begin(1, 2, 0);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(a->ready);
  EXPECT_EQ(a->response.decision().reason(), "EMPTY_WINDOW");
  EXPECT_EQ(a->response.decision().optimizer_update_id(), 1);
}

// Catches: a prefetched empty window ended (and logged) after the stop condition was
// reached, only because the final checkpoint is still being written.
TEST(StepMachineTest, NoEmptyWindowEndsAfterTheStop) {
  SpecOptions o = WithCheckpoints(100);
  o.max_updates = 1;
  SimulatedRanks sim(ResolvedSpec(o));
  sim.Start(2);
  sim.BeginAll(1, {10, 10});
  for (int rank = 0; rank < 2; ++rank) {
    auto a = sim.Begin(rank, 2, 0);  // the workers cannot know window 1 will be the last
    ASSERT_TRUE(a.ok());
    EXPECT_FALSE(a->ready);
  }
  const v1::WindowDecision last = sim.CompleteAll(1, Reports(2));
  ASSERT_TRUE(last.job_done());
  ASSERT_TRUE(last.write_checkpoint());
  EXPECT_EQ(sim.progress().window_id(), 1);
  EXPECT_EQ(sim.machine().updates().size(), 1u);
  EXPECT_EQ(CodeOf(sim.Begin(0, 2, 0)), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(sim.Ack(last.checkpoint_id(), 1).ok());
  EXPECT_EQ(sim.state(), v1::SUCCEEDED);
  EXPECT_EQ(sim.progress().window_id(), 1);
}

// Catches: a non-finite loss committed (poisoning the log and the weights) or treated as
// an overflow (backing the scale off).
TEST(StepMachineTest, NonfiniteLossSkips) {
  for (double bad : {kNaN, kInf}) {
    SimulatedRanks sim(ResolvedSpec(Fp16(1024)));
    sim.Start(2);
    ASSERT_EQ(sim.RunWindow().outcome(), v1::COMMIT);
    const v1::ScalerState before = sim.machine().Snapshot().scaler();
    RankReport ok;
    RankReport nan = ok;
    nan.loss_sum = bad;
    const v1::WindowDecision d = sim.RunWindow({ok, nan});
    EXPECT_EQ(d.outcome(), v1::SKIP);
    EXPECT_EQ(d.reason(), "NONFINITE_LOSS");
    EXPECT_EQ(d.optimizer_update_id(), 1);
    EXPECT_EQ(d.scheduler_step(), 1);
    EXPECT_EQ(sim.progress().optimizer_update_id(), 1);
    EXPECT_EQ(sim.progress().window_id(), 2);
    EXPECT_EQ(sim.progress().cumulative_tokens(), 20);
    EXPECT_EQ(sim.machine().Snapshot().scaler().SerializeAsString(), before.SerializeAsString());
  }
}

// Catches: the logged loss as a mean of per-rank means (0.5a + 0.5b) instead of
// Σ loss_sum / N (0.1a + 0.9b) — docs/numerics.md, rules 1 and 19, the 100/900 tokens example.
TEST(StepMachineTest, LossIsTokenWeighted) {
  SimulatedRanks sim(ResolvedSpec({}));
  sim.Start(2);
  const double a = 2.0, b = 0.5;
  const v1::BeginWindowResponse begin = sim.BeginAll(1, {100, 900});
  EXPECT_EQ(begin.global_valid_units(), 1000);
  const v1::WindowDecision d =
      sim.CompleteAll(1, {{100 * a, 100, false, 1.0, 1, 1}, {900 * b, 900, false, 1.0, 1, 1}});
  ASSERT_EQ(d.outcome(), v1::COMMIT);
  EXPECT_DOUBLE_EQ(d.record().loss(), 0.1 * a + 0.9 * b);
  EXPECT_NE(d.record().loss(), 0.5 * a + 0.5 * b);
  EXPECT_EQ(d.record().global_valid_tokens(), 1000);
  EXPECT_DOUBLE_EQ(sim.progress().last_loss(), 0.65);
}

// Catches: diverged replicas (norm, found_inf or collective-call count disagreeing) that
// commit or skip silently instead of ABORT DESYNC and a re-formed generation of the same
// members that rebroadcasts from rank 0 and retries the same window.
TEST(StepMachineTest, DesyncAbortsAndReformsSameMembers) {
  struct Case {
    const char* name;
    RankReport rank1;
  };
  RankReport base;
  RankReport norm = base;
  norm.grad_norm = base.grad_norm * (1 + 1e-5);
  RankReport inf = base;
  inf.found_inf = true;
  RankReport calls = base;
  calls.allreduce_calls = 2;
  for (const Case& c :
       {Case{"grad norm", norm}, Case{"found_inf", inf}, Case{"allreduce", calls}}) {
    SCOPED_TRACE(c.name);
    SimulatedRanks sim(ResolvedSpec(WithCheckpoints(100, Fp16(1024))));
    sim.Start(2);
    const std::vector<std::string> ranks = sim.Ranks();
    const v1::WindowDecision d = sim.RunWindow({base, c.rank1});
    EXPECT_EQ(d.outcome(), v1::ABORT);
    EXPECT_EQ(d.reason(), "DESYNC");
    EXPECT_EQ(d.optimizer_update_id(), 0);
    EXPECT_EQ(d.scheduler_step(), 0);
    EXPECT_FALSE(d.write_checkpoint());
    EXPECT_EQ(d.record().outcome(), "abort");
    EXPECT_EQ(d.record().loss_scale(), 1024);  // no scaler update on an abort
    const v1::JobProgress p = sim.progress();
    EXPECT_EQ(p.window_id(), 0);
    EXPECT_EQ(p.optimizer_update_id(), 0);
    EXPECT_EQ(p.windows_aborted(), 1);
    EXPECT_EQ(p.loss_scale(), 1024);
    EXPECT_EQ(p.generation(), 2);
    EXPECT_EQ(sim.Ranks(), ranks);

    // Rank 0, which reported first, gets the same abort when it asks again.
    v1::CompleteWindowRequest first = sim.CompleteRequest(0, 1, base);
    first.set_generation(1);
    auto again = sim.Complete(first);
    ASSERT_TRUE(again.ok());
    ASSERT_TRUE(again->ready);
    EXPECT_EQ(again->response.decision().SerializeAsString(), d.SerializeAsString());

    for (int rank = 0; rank < 2; ++rank) {
      auto hb = sim.Heartbeat(ranks[rank]);
      ASSERT_TRUE(hb.ok());
      ASSERT_TRUE(hb->assigned());
      EXPECT_EQ(hb->assignment().generation(), 2);
      EXPECT_EQ(hb->assignment().state_source(), v1::Assignment::BROADCAST);
      EXPECT_EQ(hb->assignment().source_rank(), 0);
      EXPECT_EQ(hb->assignment().next_window_id(), 1);
    }
    const v1::WindowDecision retry = sim.RunWindow();
    EXPECT_EQ(retry.outcome(), v1::COMMIT);
    EXPECT_EQ(retry.record().window_id(), 1);
    EXPECT_EQ(retry.record().generation(), 2);
  }
}

// Catches: norms that agree to 1e-6 relative (float summation order) treated as a desync.
TEST(StepMachineTest, NormsWithinToleranceCommit) {
  SimulatedRanks sim(ResolvedSpec({}));
  sim.Start(2);
  RankReport a;
  a.grad_norm = 3.0;
  RankReport b = a;
  b.grad_norm = 3.0 * (1 + 0.5e-6);
  EXPECT_EQ(sim.RunWindow({a, b}).outcome(), v1::COMMIT);
}

// Catches: endless DESYNC retries (the job must fail after 3 in a row) or a count that is
// not reset by a good window.
TEST(StepMachineTest, ThreeConsecutiveDesyncsFailTheJob) {
  SimulatedRanks sim(ResolvedSpec({}));
  sim.Start(2);
  RankReport good;
  RankReport bad = good;
  bad.grad_norm = 7.0;
  EXPECT_EQ(sim.RunWindow({good, bad}).reason(), "DESYNC");
  EXPECT_EQ(sim.RunWindow({good, good}).outcome(), v1::COMMIT);  // resets the count
  EXPECT_EQ(sim.RunWindow({good, bad}).reason(), "DESYNC");
  EXPECT_EQ(sim.RunWindow({good, bad}).reason(), "DESYNC");
  EXPECT_EQ(sim.state(), v1::RUNNING);
  const v1::WindowDecision third = sim.RunWindow({good, bad});
  EXPECT_EQ(third.outcome(), v1::ABORT);
  EXPECT_EQ(sim.state(), v1::FAILED);
  EXPECT_THAT(sim.job().message(), HasSubstr("3 times in a row at window 2"));
  EXPECT_THAT(sim.job().message(), HasSubstr("grad norm"));
  EXPECT_EQ(sim.progress().windows_aborted(), 4);
  EXPECT_EQ(sim.progress().optimizer_update_id(), 1);
}

// Catches cumulative_tokens wrapping negative after many windows of the largest valid N.
TEST(StepMachineTest, CumulativeTokensSaturate) {
  SpecOptions o;
  o.workers = 1;
  SimulatedRanks sim(ResolvedSpec(o));
  sim.Start(1);
  RankReport big;
  big.units = int64_t{1} << 53;
  big.loss_sum = 1.0;
  for (int i = 0; i < 1030; ++i) ASSERT_EQ(sim.RunWindow(Reports(1, big)).outcome(), v1::COMMIT);
  EXPECT_EQ(sim.progress().cumulative_tokens(), std::numeric_limits<int64_t>::max());
}

// Catches: clipping against the scaled norm (S·‖g‖ = 16 → coefficient 1/16, the update nearly
// erased) instead of the unscaled norm the workers report (2.0 → 0.5, clipped norm 1.0).
TEST(ReferenceNumbersTest, ClipUsesUnscaledNorm) {
  SpecOptions o = Fp16(/*init_scale=*/8);
  o.workers = 1;
  o.max_grad_norm = 1.0;
  SimulatedRanks sim(ResolvedSpec(o));
  sim.Start(1);
  EXPECT_EQ(sim.BeginAll(1, {30}).loss_scale(), 8);
  RankReport r;
  r.units = 30;
  r.grad_norm = 2.0;  // K = 3, S = 8: accumulated 16, unscaled 2.0
  r.micro_steps = 3;
  const v1::WindowDecision d = sim.CompleteAll(1, {r});
  ASSERT_EQ(d.outcome(), v1::COMMIT);
  EXPECT_NEAR(d.clip_coef(), 0.5, 1e-6);
  EXPECT_NEAR(d.record().grad_norm_post_clip(), 1.0, 1e-6);
  EXPECT_GT(d.clip_coef(), 1.0 / 16 * 4);  // far from the scaled-space answer
  EXPECT_EQ(d.record().grad_norm_pre_clip(), 2.0);
}

// Catches: a scheduler that counts micro-batches (8) instead of optimizer updates (2).
TEST(ReferenceNumbersTest, TwoKMicroBatchesAdvanceSchedulerTwice) {
  SpecOptions o;
  o.workers = 1;
  o.accumulation_steps = 4;
  SimulatedRanks sim(ResolvedSpec(o));
  sim.Start(1);
  RankReport r;
  r.micro_steps = 4;
  sim.RunWindow({r});
  const v1::WindowDecision d = sim.RunWindow({r});
  EXPECT_EQ(d.scheduler_step(), 2);
  EXPECT_EQ(sim.progress().scheduler_step(), 2);
  EXPECT_EQ(sim.progress().optimizer_update_id(), 2);
  int64_t micro = 0;
  for (const v1::UpdateRecord& u : sim.machine().updates()) micro += u.micro_steps();
  EXPECT_EQ(micro, 8);
}

// Catches: an overflow in one micro-batch that backs the scale off once per micro-batch
// (K times) or advances the scheduler.
TEST(ReferenceNumbersTest, OneOverflowWindowOfTwo) {
  SpecOptions o = Fp16(65536);
  o.workers = 1;
  o.accumulation_steps = 4;
  SimulatedRanks sim(ResolvedSpec(o));
  sim.Start(1);
  RankReport r;
  r.micro_steps = 4;
  RankReport inf = r;
  inf.found_inf = true;  // overflow in micro-batch 2: seen once, after the all-reduce
  sim.RunWindow({inf});
  sim.RunWindow({r});
  EXPECT_EQ(sim.progress().scheduler_step(), 1);
  EXPECT_EQ(sim.progress().optimizer_update_id(), 1);
  EXPECT_EQ(sim.progress().loss_scale(), 32768);  // ×0.5 exactly once
  EXPECT_EQ(sim.progress().window_id(), 2);
}

}  // namespace
}  // namespace trainstep
