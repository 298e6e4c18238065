// StepMachine tests: The window barrier (coordinator/step_machine/window_barrier.cc).
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "coordinator/step_machine.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/coordinator/step_machine/step_machine_test_util.h"

namespace trainstep {
namespace {

using ::testing::HasSubstr;
using testing_util::CodeOf;
using testing_util::Elastic;
using testing_util::FormedWith;
using testing_util::Fp16;
using testing_util::kInf;
using testing_util::kNaN;
using testing_util::MessageOf;
using testing_util::RankReport;
using testing_util::Reports;
using testing_util::ResolvedSpec;
using testing_util::ShrunkToOneInWindow2;
using testing_util::SimulatedRanks;
using testing_util::SpecOptions;
using testing_util::WithEval;

// Catches: a barrier answered before every rank reported, a wrong N = Σ n_r, scale or lr,
// or a repeated call that gets a different answer.
TEST(StepMachineTest, BeginBarrierWaitsForAllRanks) {
  SpecOptions o = Fp16(4096);
  o.workers = 3;
  o.lr = 0.2;
  SimulatedRanks sim(ResolvedSpec(o));
  sim.Start(3);
  auto a = sim.Begin(0, 1, 11);
  ASSERT_TRUE(a.ok());
  EXPECT_FALSE(a->ready);
  a = sim.Begin(0, 1, 11);  // a retry does not count twice
  ASSERT_TRUE(a.ok());
  EXPECT_FALSE(a->ready);
  a = sim.Begin(2, 1, 13);
  ASSERT_TRUE(a.ok());
  EXPECT_FALSE(a->ready);
  a = sim.Begin(1, 1, 0);  // a rank with nothing to train still counts
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(a->ready);
  const v1::BeginWindowResponse& r = a->response;
  EXPECT_EQ(r.global_valid_units(), 24);
  EXPECT_EQ(r.loss_scale(), 4096);
  EXPECT_DOUBLE_EQ(r.learning_rate(), 0.2);
  EXPECT_EQ(r.scheduler_step(), 0);
  EXPECT_EQ(r.optimizer_update_id(), 0);
  EXPECT_EQ(r.epoch(), 0);
  EXPECT_FALSE(r.has_decision());

  for (int rank = 0; rank < 3; ++rank) {
    auto again = sim.Begin(rank, 1, rank == 0 ? 11 : rank == 1 ? 0 : 13);
    ASSERT_TRUE(again.ok());
    ASSERT_TRUE(again->ready);
    EXPECT_EQ(again->response.SerializeAsString(), r.SerializeAsString());
  }
  EXPECT_EQ(sim.progress().window_id(), 0);  // the barrier decides nothing
  EXPECT_EQ(sim.progress().optimizer_update_id(), 0);
}

// Catches: a prefetched BeginWindow(w+1) answered before w is decided, with the lr, scale
// or ids of before w's decision.
TEST(StepMachineTest, PrefetchAnsweredOnlyAfterPreviousWindowDecided) {
  SpecOptions o = Fp16(1024, /*growth_interval=*/1);
  o.max_updates = 100;
  o.schedule = R"({"warmup_linear":{"warmup_updates":4,"total_updates":100}})";
  SimulatedRanks sim(ResolvedSpec(o));
  sim.Start(2);
  v1::BeginWindowResponse w1 = sim.BeginAll(1, {10, 10});
  EXPECT_DOUBLE_EQ(w1.learning_rate(), 0.1 * 0.25);
  EXPECT_EQ(w1.loss_scale(), 1024);

  for (int rank = 0; rank < 2; ++rank) {
    auto a = sim.Begin(rank, 2, 7);
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_FALSE(a->ready) << "window 2 answered while window 1 is undecided";
  }
  // A CompleteWindow for the prefetched window is refused while window 1 is open.
  EXPECT_EQ(CodeOf(sim.Complete(0, 2, RankReport{})), absl::StatusCode::kFailedPrecondition);

  const v1::WindowDecision d1 = sim.CompleteAll(1, Reports(2));
  ASSERT_EQ(d1.outcome(), v1::COMMIT);
  EXPECT_DOUBLE_EQ(d1.learning_rate(), 0.1 * 0.25);  // the lr of the update made, not the next
  EXPECT_DOUBLE_EQ(d1.record().learning_rate(), 0.1 * 0.25);
  auto a = sim.Begin(0, 2, 7);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(a->ready);
  EXPECT_EQ(a->response.global_valid_units(), 14);
  EXPECT_EQ(a->response.scheduler_step(), 1);
  EXPECT_EQ(a->response.optimizer_update_id(), 1);
  EXPECT_DOUBLE_EQ(a->response.learning_rate(), 0.1 * 0.5);
  EXPECT_EQ(a->response.loss_scale(), 2048);  // grown after window 1 (interval 1)
}

// Catches: window_seconds not measured from the first report of the window to its decision.
TEST(StepMachineTest, WindowSecondsFromFirstReport) {
  SimulatedRanks sim(ResolvedSpec({}));
  sim.Start(2);
  ASSERT_FALSE(sim.Begin(1, 1, 10)->ready);
  sim.Advance(absl::Milliseconds(1500));
  ASSERT_TRUE(sim.Begin(0, 1, 10)->ready);
  sim.Advance(absl::Seconds(1));
  const v1::WindowDecision d = sim.CompleteAll(1, Reports(2));
  EXPECT_DOUBLE_EQ(d.record().window_seconds(), 2.5);
  EXPECT_EQ(d.record().end_time_ms(), absl::ToUnixMillis(sim.now()));
}

// Catches: window_seconds of a window counted from its begin reports sent ahead (pipelined)
// during the window before it: the two windows' times would overlap (and the window duration
// histogram double).
TEST(StepMachineTest, WindowSecondsOfAPipelinedWindowStartAtThePreviousDecision) {
  SimulatedRanks sim(ResolvedSpec({}));
  sim.Start(2);
  sim.BeginAll(1, {10, 10});
  for (int r = 0; r < 2; ++r) ASSERT_FALSE(sim.Begin(r, 2, 10)->ready);  // sent ahead
  sim.Advance(absl::Seconds(3));
  EXPECT_DOUBLE_EQ(sim.CompleteAll(1, Reports(2)).record().window_seconds(), 3.0);
  sim.Advance(absl::Seconds(2));
  EXPECT_DOUBLE_EQ(sim.CompleteAll(2, Reports(2)).record().window_seconds(), 2.0);
}

// Catches: a repeated report that changes state or gets another answer, and a conflicting
// repeat that is silently accepted.
TEST(StepMachineTest, RepeatedReportsAreIdempotent) {
  SimulatedRanks sim(ResolvedSpec({}));
  sim.Start(2);
  sim.BeginAll(1, {10, 10});
  // A different n_r for the same window is refused, at both barriers.
  EXPECT_EQ(CodeOf(sim.Begin(0, 1, 11)), absl::StatusCode::kInvalidArgument);
  RankReport r;
  RankReport other_units = r;
  other_units.units = 11;
  EXPECT_EQ(CodeOf(sim.Complete(0, 1, other_units)), absl::StatusCode::kInvalidArgument);

  auto c = sim.Complete(0, 1, r);
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->ready);
  c = sim.Complete(0, 1, r);  // the same report again: still waiting, nothing changed
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->ready);
  RankReport conflicting = r;
  conflicting.loss_sum = 11;
  EXPECT_EQ(CodeOf(sim.Complete(0, 1, conflicting)), absl::StatusCode::kInvalidArgument);

  const size_t records = sim.records().size();
  c = sim.Complete(1, 1, r);
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(c->ready);
  const v1::WindowDecision d = c->response.decision();
  EXPECT_EQ(d.outcome(), v1::COMMIT);
  EXPECT_DOUBLE_EQ(d.record().loss(), 1.0);  // the conflicting report was not taken
  EXPECT_EQ(sim.records().size(), records + 1);

  for (int rank = 0; rank < 2; ++rank) {
    c = sim.Complete(rank, 1, r);
    ASSERT_TRUE(c.ok());
    ASSERT_TRUE(c->ready);
    EXPECT_EQ(c->response.decision().SerializeAsString(), d.SerializeAsString());
  }
  EXPECT_EQ(sim.records().size(), records + 1);  // repeats journal nothing
  EXPECT_EQ(sim.progress().optimizer_update_id(), 1);
}

// Catches: reports from stale generations, wrong ranks, unknown workers or windows out of
// protocol order that are accepted (or answered with the wrong canonical code).
TEST(StepMachineTest, RejectsOutOfProtocolReports) {
  SimulatedRanks sim(ResolvedSpec({}));
  const std::vector<std::string> ids = {sim.AddWorker(), sim.AddWorker()};
  ASSERT_TRUE(sim.Heartbeat(ids[0]).ok());
  // Before any generation: generation 1 does not exist yet.
  v1::BeginWindowRequest early;
  early.set_job_id(sim.job_id());
  early.set_worker_id(ids[0]);
  early.set_generation(1);
  early.set_window_id(1);
  EXPECT_EQ(CodeOf(sim.Begin(early)), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(sim.Heartbeat(ids[1]).ok());

  // Unknown worker.
  v1::BeginWindowRequest unknown = sim.BeginRequest(0, 1, 10);
  unknown.set_worker_id("w-999");
  EXPECT_EQ(CodeOf(sim.Begin(unknown)), absl::StatusCode::kNotFound);
  v1::CompleteWindowRequest unknown_c = sim.CompleteRequest(0, 1, {});
  unknown_c.set_worker_id("w-999");
  EXPECT_EQ(CodeOf(sim.Complete(unknown_c)), absl::StatusCode::kNotFound);
  v1::HeartbeatRequest unknown_hb;
  unknown_hb.set_worker_id("w-999");
  EXPECT_EQ(CodeOf(sim.machine().Heartbeat(unknown_hb, sim.now())), absl::StatusCode::kNotFound);
  v1::ReportFailureRequest unknown_f;
  unknown_f.set_worker_id("w-999");
  EXPECT_EQ(CodeOf(sim.machine().ReportFailure(unknown_f, sim.now())), absl::StatusCode::kNotFound);

  // Wrong rank.
  v1::BeginWindowRequest wrong_rank = sim.BeginRequest(0, 1, 10);
  wrong_rank.set_rank(1);
  EXPECT_EQ(CodeOf(sim.Begin(wrong_rank)), absl::StatusCode::kFailedPrecondition);
  // A generation from the future.
  v1::BeginWindowRequest future = sim.BeginRequest(0, 1, 10);
  future.set_generation(2);
  EXPECT_EQ(CodeOf(sim.Begin(future)), absl::StatusCode::kFailedPrecondition);
  // Too far ahead: only the next window and the one after it (prefetch) exist.
  EXPECT_EQ(CodeOf(sim.Begin(0, 3, 10)), absl::StatusCode::kFailedPrecondition);
  // Negative units.
  EXPECT_EQ(CodeOf(sim.Begin(0, 1, -1)), absl::StatusCode::kInvalidArgument);
  RankReport negative;
  negative.micro_steps = -1;
  EXPECT_EQ(CodeOf(sim.Complete(0, 1, negative)), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(sim.progress().window_id(), 0);

  ASSERT_EQ(sim.RunWindow().outcome(), v1::COMMIT);
  // A window that already ended, asked about from a later generation (no decision of it there).
  RankReport bad;
  bad.grad_norm = 9;
  ASSERT_EQ(sim.RunWindow({RankReport{}, bad}).reason(), "DESYNC");  // window 2, gen 1 → gen 2
  ASSERT_EQ(sim.generation(), 2);
  EXPECT_EQ(CodeOf(sim.Begin(0, 1, 10)), absl::StatusCode::kAborted);  // window 1 already ended

  // Stale generation: a report for gen 1 of a window that gen 1 never decided.
  v1::BeginWindowRequest stale = sim.BeginRequest(0, 3, 10);
  stale.set_generation(1);
  absl::StatusOr<Answer<v1::BeginWindowResponse>> s = sim.Begin(stale);
  EXPECT_EQ(CodeOf(s), absl::StatusCode::kAborted);
  v1::CompleteWindowRequest stale_c = sim.CompleteRequest(0, 2, {});
  stale_c.set_generation(1);
  stale_c.set_window_id(3);
  EXPECT_EQ(CodeOf(sim.Complete(stale_c)), absl::StatusCode::kAborted);
  EXPECT_EQ(sim.progress().window_id(), 1);
}

// Catches: a CompleteWindow that does not count the rank's units when its BeginWindow was
// lost (the coordinator restarted between the two), so the window never ends; and one that
// counts twice when the rank's BeginWindow did reach the restarted coordinator.
TEST(StepMachineTest, CompleteWithoutBeginCountsUnitsAfterARestart) {
  SimulatedRanks sim(ResolvedSpec({}));
  sim.Start(2);
  ASSERT_EQ(sim.RunWindow().outcome(), v1::COMMIT);
  // A restarted coordinator: window 2's begin barrier was answered by the previous one.
  sim.registry().Restore(sim.registry().Snapshot(), sim.now());
  sim.registry().Recovered(sim.now());
  auto c = sim.Complete(0, 2, RankReport{30, 30, false, 1.0, 2, 1});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->ready);
  // Re-sent while it waits (the client's barrier poll), before anyone else reported: still
  // the same accepted report, not "CompleteWindow before the begin barrier" (a stuck job seen
  // in CliE2eTest.WatchSurvivesACoordinatorRestart).
  c = sim.Complete(0, 2, RankReport{30, 30, false, 1.0, 2, 1});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->ready);
  // Rank 1's answer was lost with the old coordinator: it begins again, then completes.
  auto b = sim.Begin(1, 2, 10);
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_TRUE(b->ready);
  EXPECT_EQ(b->response.global_valid_units(), 40);
  c = sim.Complete(1, 2, RankReport{10, 10, false, 1.0, 2, 1});
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(c->ready);
  EXPECT_EQ(c->response.decision().outcome(), v1::COMMIT);
  EXPECT_EQ(c->response.decision().record().global_valid_tokens(), 40);  // counted once each
  EXPECT_DOUBLE_EQ(c->response.decision().record().loss(), 1.0);
  EXPECT_EQ(sim.progress().cumulative_tokens(), 60);
}

// Decision (README "Where this differs"): a CompleteWindow stands for a missing BeginWindow
// only for the window in flight when the coordinator recovered. Catches a CompleteWindow sent
// before its BeginWindow (or before the begin barrier answered N) being counted as the rank's
// begin report, which let a rank that never knew N complete the begin barrier.
TEST(StepMachineTest, CompleteBeforeTheBeginBarrierIsRefused) {
  SimulatedRanks sim(ResolvedSpec({}));
  sim.Start(2);
  auto c = sim.Complete(0, 1, RankReport{});
  EXPECT_EQ(CodeOf(c), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(MessageOf(c), HasSubstr("without a BeginWindow"));
  ASSERT_FALSE(sim.Begin(0, 1, 10)->ready);
  c = sim.Complete(0, 1, RankReport{});
  EXPECT_EQ(CodeOf(c), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(MessageOf(c), HasSubstr("before the window's begin barrier completed"));
  // Rank 1 was not counted by the refused reports: its BeginWindow is what completes the
  // barrier.
  auto b = sim.Begin(1, 1, 7);
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_TRUE(b->ready);
  EXPECT_EQ(b->response.global_valid_units(), 17);

  // After a restart only the window then in flight accepts the stand-in.
  sim.CompleteAll(1, {RankReport{10, 10}, RankReport{7, 7}});
  sim.registry().Restore(sim.registry().Snapshot(), sim.now());
  sim.registry().Recovered(sim.now());
  ASSERT_FALSE(sim.Complete(0, 2, RankReport{})->ready);  // window 2: in flight at recovery
  ASSERT_TRUE(sim.Complete(1, 2, RankReport{})->ready);
  EXPECT_EQ(CodeOf(sim.Complete(0, 3, RankReport{})), absl::StatusCode::kFailedPrecondition);
}

// Every number a worker reports is range-checked in one place (report_validation.h), before
// the machine looks at it. Catches the probe's findings: valid_units 2^62 on two ranks
// wrapped global_valid_units negative, grad_norm -1 committed with clip_coef -1.000001,
// micro_steps 2^63-1 on two ranks logged as -2, dataset.samples 2^63-1 gave a negative
// windows_per_epoch.
TEST(StepMachineTest, ReportsOutOfRangeAreRefusedNamingTheField) {
  SpecOptions o;
  o.max_grad_norm = 1.0;
  SimulatedRanks sim(ResolvedSpec(o));
  const std::vector<std::string> ids = sim.Start(2);
  constexpr int64_t kHuge = int64_t{1} << 62;
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  const size_t records = sim.records().size();

  auto b = sim.Begin(0, 1, kHuge);
  EXPECT_EQ(CodeOf(b), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MessageOf(b),
            "BeginWindowRequest.valid_units must be ≥ 0 and ≤ 2^53, got 4611686018427387904");
  EXPECT_EQ(CodeOf(sim.Begin(0, 1, -1)), absl::StatusCode::kInvalidArgument);
  // Each rank within the bound, but not their sum.
  ASSERT_TRUE(sim.Begin(0, 1, int64_t{1} << 53).ok());
  b = sim.Begin(1, 1, int64_t{1} << 53);
  EXPECT_EQ(CodeOf(b), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(MessageOf(b), HasSubstr("exceed 2^53"));

  SimulatedRanks sim2(ResolvedSpec(o));
  sim2.Start(2);
  sim2.BeginAll(1, {10, 10});
  RankReport negative_norm;
  negative_norm.grad_norm = -1;
  auto c = sim2.Complete(0, 1, negative_norm);
  EXPECT_EQ(CodeOf(c), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(MessageOf(c), HasSubstr("CompleteWindowRequest.grad_norm must be ≥ 0"));
  RankReport minus_inf;
  minus_inf.grad_norm = -kInf;
  EXPECT_EQ(CodeOf(sim2.Complete(0, 1, minus_inf)), absl::StatusCode::kInvalidArgument);
  RankReport negative_scaled;
  negative_scaled.grad_norm_scaled = -2;
  c = sim2.Complete(0, 1, negative_scaled);
  EXPECT_EQ(CodeOf(c), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(MessageOf(c), HasSubstr("CompleteWindowRequest.grad_norm_scaled must be ≥ 0"));
  for (const double bad : {-1e-3, kInf, std::nan(""), 86401.0}) {
    RankReport bad_phase;
    bad_phase.compute_seconds = bad;
    c = sim2.Complete(0, 1, bad_phase);
    EXPECT_EQ(CodeOf(c), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(MessageOf(c), HasSubstr("CompleteWindowRequest.phases.compute_seconds must be "
                                        "between 0 and 86400 seconds"));
  }
  RankReport many_steps;
  many_steps.micro_steps = kMax;
  c = sim2.Complete(0, 1, many_steps);
  EXPECT_EQ(CodeOf(c), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(MessageOf(c), HasSubstr("CompleteWindowRequest.micro_steps must be ≥ 0 and ≤ 2^32"));
  RankReport many_calls;
  many_calls.allreduce_calls = -1;
  EXPECT_THAT(MessageOf(sim2.Complete(0, 1, many_calls)),
              HasSubstr("CompleteWindowRequest.allreduce_calls"));
  // An overflow window legitimately reports a non-finite norm (and loss).
  RankReport overflow;
  overflow.found_inf = true;
  overflow.grad_norm = kNaN;
  overflow.loss_sum = kInf;
  const v1::WindowDecision d = sim2.CompleteAll(1, Reports(2, overflow));
  EXPECT_EQ(d.outcome(), v1::SKIP);
  EXPECT_EQ(d.reason(), "OVERFLOW");

  v1::DatasetInfo huge = sim.dataset();
  huge.set_samples(kMax);
  SimulatedRanks fresh(ResolvedSpec(o));
  const std::string w = fresh.AddWorker();
  auto hb = fresh.Heartbeat(w, huge);
  EXPECT_EQ(CodeOf(hb), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MessageOf(hb),
            "HeartbeatRequest.dataset.samples must be ≥ 1 and ≤ 2^53, got 9223372036854775807");
  huge.set_samples(0);
  EXPECT_EQ(CodeOf(fresh.Heartbeat(w, huge)), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(fresh.progress().windows_per_epoch(), 0);

  v1::AckCheckpointRequest ack;
  ack.set_worker_id(ids[0]);
  ack.set_checkpoint_id(-1);
  EXPECT_EQ(CodeOf(sim.machine().AckCheckpoint(ack, sim.now())),
            absl::StatusCode::kInvalidArgument);
  // Nothing refused changed the job.
  EXPECT_EQ(sim.records().size(), records);
  EXPECT_EQ(sim.progress().window_id(), 0);
}

// The other rank of two stops heartbeating: its lease expires while `survivor` heartbeats,
// saying it holds update 0, until past a 5 s join grace, so that only what the survivor holds
// decides whether a generation can form.
void OutliveTheOtherRank(SimulatedRanks& sim, const std::string& survivor) {
  sim.Advance(sim.options().worker_lease / 2);
  ASSERT_TRUE(sim.HeartbeatAs(survivor, 0).ok());
  sim.Advance(sim.options().worker_lease / 2 + absl::Milliseconds(1));
  sim.Tick();
  sim.Advance(absl::Seconds(6));
  ASSERT_TRUE(sim.HeartbeatAs(survivor, 0).ok());
  sim.Tick();
}

// A begin report sent ahead (pipelined) and polled again once the window before it is
// decided says nothing about whether that rank applied the decision: its answer may still be
// on the way. The rank counts as holding the update only once it says so.
// Catches: such a poll taken as proof that the rank holds the new update, which would make it
// the source of the next generation's state while it may still hold the one before.
TEST(StepMachineTest, ABeginSentAheadDoesNotSayTheRankAppliedTheDecision) {
  SimulatedRanks sim(ResolvedSpec(Elastic(2, 1, "5s")));
  sim.Start(2);
  const std::vector<std::string> ranks = sim.Ranks();
  sim.BeginAll(1, {10, 10});
  for (int r = 0; r < 2; ++r) ASSERT_FALSE(sim.Begin(r, 2, 10)->ready);  // sent ahead
  ASSERT_EQ(sim.CompleteAll(1, Reports(2)).outcome(), v1::COMMIT);
  auto polled = sim.Begin(0, 2, 10);  // the coordinator polls the held call again
  ASSERT_TRUE(polled.ok() && polled->ready) << polled.status();
  // Rank 1 dies; rank 0 has not said yet that it applied update 1.
  const size_t before = sim.records().size();
  OutliveTheOtherRank(sim, ranks[0]);
  for (const v1::WorkerInfo& w : sim.machine().Workers()) {
    if (w.worker_id() == ranks[1]) ASSERT_EQ(w.state(), v1::LOST);
  }
  EXPECT_TRUE(sim.FormedSince(before).empty()) << "seeded from a rank that may hold update 0";
  ASSERT_TRUE(sim.HeartbeatAs(ranks[0], 1, /*idle_after=*/sim.generation()).ok());
  const std::vector<v1::GenerationFormed> formed = sim.FormedSince(before);
  ASSERT_EQ(formed.size(), 1u);
  EXPECT_EQ(formed[0].assignment().state_source(), v1::Assignment::BROADCAST);
  EXPECT_EQ(formed[0].assignment().optimizer_update_id(), 1);
  EXPECT_FALSE(formed[0].rolled_back());
}

// Rank `rank`'s CompleteWindow of `window`, carrying its begin report of window + 1.
v1::CompleteWindowRequest Riding(SimulatedRanks& sim, int rank, int64_t window, int64_t next_units,
                                 const RankReport& r = {}) {
  v1::CompleteWindowRequest req = sim.CompleteRequest(rank, window, r);
  *req.mutable_next() = sim.BeginRequest(rank, window + 1, next_units);
  return req;
}

// Catches: a riding report left unanswered (two calls per window again), answered with the
// wrong N or with the ids from before the decision, answered only to the rank whose report
// decided, or the next window still wanting a BeginWindow of its own.
TEST(StepMachineTest, ABeginRidingOnCompleteWindowIsAnsweredWithTheDecision) {
  SimulatedRanks sim(ResolvedSpec({}));
  sim.Start(2);
  sim.BeginAll(1, {10, 10});
  const v1::CompleteWindowRequest r0 = Riding(sim, 0, 1, 7);
  auto first = sim.Complete(r0);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_FALSE(first->ready);
  auto last = sim.Complete(Riding(sim, 1, 1, 5));
  ASSERT_TRUE(last.ok() && last->ready) << last.status();
  EXPECT_EQ(last->response.decision().outcome(), v1::COMMIT);
  ASSERT_TRUE(last->response.has_next());
  const v1::BeginWindowResponse& next = last->response.next();
  EXPECT_FALSE(next.has_decision());
  EXPECT_EQ(next.global_valid_units(), 12);
  EXPECT_EQ(next.optimizer_update_id(), 1);  // after window 1's commit
  EXPECT_EQ(next.scheduler_step(), 1);
  auto polled = sim.Complete(r0);  // rank 0's waiting call, polled again
  ASSERT_TRUE(polled.ok() && polled->ready) << polled.status();
  EXPECT_EQ(polled->response.next().SerializeAsString(), next.SerializeAsString());
  // Window 2 needs no BeginWindow: its barrier passed with window 1's decision.
  RankReport seven, five;
  seven.units = 7;
  five.units = 5;
  const v1::WindowDecision d2 = sim.CompleteAll(2, {seven, five});
  EXPECT_EQ(d2.outcome(), v1::COMMIT);
  EXPECT_EQ(d2.record().global_valid_tokens(), 12);
}

// Catches: the riding answer computed before the decision (the scale before a SKIP's backoff),
// i.e. a window run at a stale loss scale.
TEST(StepMachineTest, ABeginRidingOnASkippedWindowCarriesTheBackedOffScale) {
  SimulatedRanks sim(ResolvedSpec(Fp16(1024)));
  sim.Start(2);
  sim.BeginAll(1, {10, 10});
  RankReport inf;
  inf.found_inf = true;
  ASSERT_FALSE(sim.Complete(Riding(sim, 0, 1, 10, inf))->ready);
  auto last = sim.Complete(Riding(sim, 1, 1, 10, inf));
  ASSERT_TRUE(last.ok() && last->ready) << last.status();
  EXPECT_EQ(last->response.decision().reason(), "OVERFLOW");
  ASSERT_TRUE(last->response.has_next());
  EXPECT_EQ(last->response.next().loss_scale(), 512);
  EXPECT_EQ(last->response.next().optimizer_update_id(), 0);
}

// The rank whose report decides a window learns the decision only from that call's answer;
// its riding report must not count as the rank holding the new update.
// Catches: the riding report counted after the decision (as a BeginWindow of the window now in
// progress), which would make that rank the source of the next generation's state while it
// may still hold the update before (its answer lost on the way).
TEST(StepMachineTest, ABeginRidingOnTheDecidingReportDoesNotSayTheRankAppliedIt) {
  SimulatedRanks sim(ResolvedSpec(Elastic(2, 1, "5s")));
  sim.Start(2);
  const std::vector<std::string> ranks = sim.Ranks();
  sim.BeginAll(1, {10, 10});
  ASSERT_FALSE(sim.Complete(Riding(sim, 0, 1, 10))->ready);
  auto last = sim.Complete(Riding(sim, 1, 1, 10));  // rank 1's report decides window 1
  ASSERT_TRUE(last.ok() && last->ready) << last.status();
  ASSERT_EQ(last->response.decision().outcome(), v1::COMMIT);
  // Rank 0 dies; rank 1 has not said yet that it applied update 1.
  const size_t before = sim.records().size();
  OutliveTheOtherRank(sim, ranks[1]);
  EXPECT_TRUE(sim.FormedSince(before).empty()) << "seeded from a rank that may hold update 0";
  ASSERT_TRUE(sim.HeartbeatAs(ranks[1], 1, /*idle_after=*/sim.generation()).ok());
  const std::vector<v1::GenerationFormed> formed = sim.FormedSince(before);
  ASSERT_EQ(formed.size(), 1u);
  EXPECT_EQ(formed[0].assignment().optimizer_update_id(), 1);
  EXPECT_FALSE(formed[0].rolled_back());
}

// Catches: a riding report answered for a generation that ended at the window boundary (the
// rank would run window 3 in a generation that no longer exists), or holding up the growth.
TEST(StepMachineTest, ABeginRidingIntoAGenerationThatEndsIsNotAnswered) {
  SimulatedRanks sim(ResolvedSpec(Elastic(3, 1, "0s")));
  const std::vector<std::string> g1 = ShrunkToOneInWindow2(sim);
  sim.Start(2);  // two workers come back while window 2 is in flight
  const size_t before = sim.records().size();
  auto c = sim.Complete(Riding(sim, 0, 2, 10));
  ASSERT_TRUE(c.ok() && c->ready) << c.status();
  EXPECT_EQ(c->response.decision().outcome(), v1::COMMIT);
  EXPECT_FALSE(c->response.has_next());
  ASSERT_TRUE(sim.HeartbeatAs(g1[0], 2, /*idle_after=*/sim.generation()).ok());
  const std::vector<v1::GenerationFormed> formed = FormedWith(sim, before, 3);
  ASSERT_EQ(formed.size(), 1u);
  EXPECT_EQ(formed[0].assignment().next_window_id(), 3);
}

// The decision asks for an evaluation: the next barrier waits for it, so no answer rides back;
// the BeginWindow the rank then sends on its own finds its riding report already counted.
// Catches: a riding answer that skips the evaluation, or the report counted twice (N doubled)
// or refused as a different report when sent again.
TEST(StepMachineTest, ABeginRidingPastAnEvaluationIsAnsweredAfterIt) {
  SimulatedRanks sim(ResolvedSpec(WithEval(1)));
  sim.Start(2);
  sim.BeginAll(1, {10, 10});
  ASSERT_FALSE(sim.Complete(Riding(sim, 0, 1, 6))->ready);
  auto last = sim.Complete(Riding(sim, 1, 1, 4));
  ASSERT_TRUE(last.ok() && last->ready) << last.status();
  EXPECT_TRUE(last->response.decision().run_eval());
  EXPECT_FALSE(last->response.has_next());
  auto early = sim.Begin(0, 2, 6);
  ASSERT_TRUE(early.ok()) << early.status();
  EXPECT_FALSE(early->ready);  // held until the evaluation ends
  ASSERT_TRUE(sim.Eval(0, 1, 1.0, 5).ok());
  ASSERT_TRUE(sim.Eval(1, 1, 1.0, 5).ok());
  for (int rank : {0, 1}) {
    auto b = sim.Begin(rank, 2, rank == 0 ? 6 : 4);
    ASSERT_TRUE(b.ok() && b->ready) << b.status();
    EXPECT_EQ(b->response.global_valid_units(), 10);
  }
}

// Catches: an answer riding back after the job's last window (the worker would start a window
// that does not exist).
TEST(StepMachineTest, ABeginRidingOnTheLastWindowIsNotAnswered) {
  SpecOptions o;
  o.max_updates = 1;
  SimulatedRanks sim(ResolvedSpec(o));
  sim.Start(2);
  sim.BeginAll(1, {10, 10});
  ASSERT_FALSE(sim.Complete(Riding(sim, 0, 1, 10))->ready);
  auto last = sim.Complete(Riding(sim, 1, 1, 10));
  ASSERT_TRUE(last.ok() && last->ready) << last.status();
  EXPECT_TRUE(last->response.decision().job_done());
  EXPECT_FALSE(last->response.has_next());
}

// A CompleteWindow sent again (the client re-sends while it waits) with or without its riding
// report is the same report. A riding report that is not this rank's next window is refused,
// naming the field, and changes nothing.
// Catches: a re-send refused as "two different reports", or a riding report for another rank,
// generation or window counted (N from the wrong ranks).
TEST(StepMachineTest, ARidingBeginIsTheSameRanksNextWindowAndRepeatsAreOneReport) {
  SimulatedRanks sim(ResolvedSpec({}));
  sim.Start(2);
  sim.BeginAll(1, {10, 10});
  const v1::CompleteWindowRequest good = Riding(sim, 0, 1, 10);
  struct Bad {
    const char* field;
    std::function<void(v1::BeginWindowRequest*)> damage;
  };
  const std::vector<Bad> bad = {
      {"next.window_id", [](v1::BeginWindowRequest* n) { n->set_window_id(3); }},
      {"next.rank", [](v1::BeginWindowRequest* n) { n->set_rank(1); }},
      {"next.generation", [](v1::BeginWindowRequest* n) { n->set_generation(2); }},
      {"next.worker_id", [](v1::BeginWindowRequest* n) { n->set_worker_id("w-other"); }},
      {"next.job_id", [](v1::BeginWindowRequest* n) { n->set_job_id("job-other"); }},
      {"next.valid_units", [](v1::BeginWindowRequest* n) { n->set_valid_units(-1); }},
  };
  for (const Bad& b : bad) {
    v1::CompleteWindowRequest req = good;
    b.damage(req.mutable_next());
    auto a = sim.Complete(req);
    EXPECT_EQ(CodeOf(a), absl::StatusCode::kInvalidArgument) << b.field;
    EXPECT_THAT(MessageOf(a), HasSubstr(b.field));
  }
  ASSERT_FALSE(sim.Complete(good)->ready);
  v1::CompleteWindowRequest plain = good;
  plain.clear_next();
  auto again = sim.Complete(plain);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(again->ready);
  auto last = sim.Complete(Riding(sim, 1, 1, 10));
  ASSERT_TRUE(last.ok() && last->ready) << last.status();
  ASSERT_TRUE(last->response.has_next());
  EXPECT_EQ(last->response.next().global_valid_units(), 20);  // rank 0's counted once
}

}  // namespace
}  // namespace trainstep
