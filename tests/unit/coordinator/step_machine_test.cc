#include "coordinator/step_machine.h"

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "coordinator/lr_schedule.h"
#include "core/window_outcome.h"
#include "gmock/gmock.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "gtest/gtest.h"
#include "tests/unit/coordinator/machine_test_util.h"

namespace trainstep {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing_util::RankReport;
using testing_util::Reports;
using testing_util::ResolvedSpec;
using testing_util::SimulatedRanks;
using testing_util::SpecOptions;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

absl::StatusCode CodeOf(const absl::Status& s) { return s.code(); }
template <typename T>
absl::StatusCode CodeOf(const absl::StatusOr<T>& s) {
  return s.status().code();
}

std::string MessageOf(const absl::Status& s) { return std::string(s.message()); }
template <typename T>
std::string MessageOf(const absl::StatusOr<T>& s) {
  return std::string(s.status().message());
}

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

SpecOptions Fp16(double init_scale = 1024, int64_t growth_interval = 1000) {
  SpecOptions o;
  o.precision = "fp16";
  o.loss_scaler =
      absl::StrCat(R"({"init_scale":)", init_scale, R"(,"growth_interval":)", growth_interval, "}");
  return o;
}

SpecOptions WithCheckpoints(int64_t every, SpecOptions o = {}) {
  o.checkpoint_dir = "/ckpt";
  o.every_updates = every;
  return o;
}

// ---------------------------------------------------------------------------------------
// ClipCoefficient / GradNormsAgree

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

// ---------------------------------------------------------------------------------------
// Job start

// Catches: a job that starts before all `workers.count` workers reported their dataset, or
// that never starts; a wrong first assignment.
TEST(StepMachineTest, PendingUntilAllWorkersReportDataset) {
  SpecOptions o;
  o.workers = 3;
  SimulatedRanks sim(ResolvedSpec(o));
  EXPECT_EQ(sim.state(), v1::PENDING);
  std::vector<std::string> ids = {sim.AddWorker(), sim.AddWorker(), sim.AddWorker()};
  EXPECT_EQ(sim.state(), v1::PENDING);
  ASSERT_TRUE(sim.Heartbeat(ids[0]).ok());
  ASSERT_TRUE(sim.Heartbeat(ids[1]).ok());
  EXPECT_EQ(sim.state(), v1::PENDING);

  v1::HeartbeatRequest no_dataset;  // a heartbeat without the dataset report does not count
  no_dataset.set_job_id(sim.job_id());
  no_dataset.set_worker_id(ids[2]);
  absl::StatusOr<v1::HeartbeatResponse> hb = sim.machine().Heartbeat(no_dataset, sim.now());
  ASSERT_TRUE(hb.ok()) << hb.status();
  EXPECT_FALSE(hb->dataset_accepted());
  EXPECT_FALSE(hb->assigned());
  EXPECT_EQ(hb->job_state(), v1::PENDING);
  EXPECT_EQ(sim.state(), v1::PENDING);
  EXPECT_EQ(sim.generation(), 0);

  sim.Advance(absl::Seconds(1));
  hb = sim.Heartbeat(ids[2]);
  ASSERT_TRUE(hb.ok()) << hb.status();
  EXPECT_TRUE(hb->dataset_accepted());
  EXPECT_EQ(hb->job_state(), v1::RUNNING);
  EXPECT_EQ(sim.state(), v1::RUNNING);
  EXPECT_EQ(sim.job().start_time_ms(), absl::ToUnixMillis(sim.now()));
  EXPECT_EQ(sim.generation(), 1);
  EXPECT_EQ(sim.progress().world_size(), 3);
  EXPECT_THAT(sim.Ranks(), ElementsAre(ids[0], ids[1], ids[2]));

  for (int rank = 0; rank < 3; ++rank) {
    hb = sim.Heartbeat(ids[rank]);
    ASSERT_TRUE(hb.ok());
    ASSERT_TRUE(hb->assigned());
    const v1::Assignment& a = hb->assignment();
    EXPECT_EQ(a.generation(), 1);
    EXPECT_EQ(a.rank(), rank);
    EXPECT_EQ(a.world_size(), 3);
    EXPECT_EQ(a.store_prefix(), sim.job_id() + "/g1/");
    EXPECT_EQ(a.next_window_id(), 1);
    EXPECT_EQ(a.state_source(), v1::Assignment::INIT);
    EXPECT_EQ(a.optimizer_update_id(), 0);
    EXPECT_EQ(a.scheduler_step(), 0);
    EXPECT_FALSE(a.has_pending_checkpoint_id());  // checkpoints are off
    EXPECT_EQ(hb->lease_ms(), 10000);
  }

  const std::vector<v1::WorkerInfo> workers = sim.machine().Workers();
  ASSERT_EQ(workers.size(), 3u);
  EXPECT_EQ(workers[0].worker_id(), ids[0]);
  EXPECT_EQ(workers[0].name(), "worker-1");
  EXPECT_EQ(workers[0].host(), "host-1");
  EXPECT_EQ(workers[0].job_id(), sim.job_id());
  EXPECT_EQ(workers[0].state(), v1::ACTIVE);
  EXPECT_EQ(workers[0].generation(), 1);
  EXPECT_EQ(workers[0].registered_ms(), absl::ToUnixMillis(sim.now() - absl::Seconds(1)));

  // A fourth worker is a standby: accepted, but not placed.
  const std::string extra = sim.AddWorker();
  hb = sim.Heartbeat(extra);
  ASSERT_TRUE(hb.ok());
  EXPECT_TRUE(hb->dataset_accepted());
  EXPECT_FALSE(hb->assigned());
  EXPECT_EQ(sim.generation(), 1);
}

// Catches: windows_per_epoch rounding the wrong way for tail dynamic (ceil) or drop (floor).
TEST(StepMachineTest, WindowsPerEpochByTailPolicy) {
  for (const auto& [tail, expected] : {std::pair<std::string, int64_t>{"dynamic", 3},
                                       std::pair<std::string, int64_t>{"drop", 2}}) {
    SpecOptions o;  // global batch = 1 × 2 × 2 = 4 samples
    o.tail = tail;
    SimulatedRanks sim(ResolvedSpec(o));
    sim.set_samples(10);
    sim.Start(2);
    EXPECT_EQ(sim.state(), v1::RUNNING) << tail;
    EXPECT_EQ(sim.progress().windows_per_epoch(), expected) << tail;
    EXPECT_EQ(sim.progress().dataset_samples(), 10);
  }
}

// Catches: a drop-tail job with fewer samples than one global batch that runs (and trains
// nothing) instead of failing with a clear message.
TEST(StepMachineTest, DropTailWithoutAnyWindowFailsTheJob) {
  SpecOptions o;
  o.tail = "drop";
  SimulatedRanks sim(ResolvedSpec(o));
  sim.set_samples(3);
  const std::string w = sim.AddWorker();
  absl::StatusOr<v1::HeartbeatResponse> hb = sim.Heartbeat(w);
  ASSERT_TRUE(hb.ok()) << hb.status();
  EXPECT_EQ(hb->job_state(), v1::FAILED);
  EXPECT_EQ(sim.state(), v1::FAILED);
  EXPECT_THAT(sim.job().message(), HasSubstr("3 samples"));
  EXPECT_THAT(sim.job().message(), HasSubstr("drop"));
  EXPECT_FALSE(hb->assigned());

  // The same data with tail dynamic trains one (short) window.
  o.tail = "dynamic";
  SimulatedRanks dynamic(ResolvedSpec(o));
  dynamic.set_samples(3);
  dynamic.Start(2);
  EXPECT_EQ(dynamic.state(), v1::RUNNING);
  EXPECT_EQ(dynamic.progress().windows_per_epoch(), 1);
}

// Catches: workers that read different data being accepted into one job.
TEST(StepMachineTest, DatasetMismatchRefused) {
  SimulatedRanks sim(ResolvedSpec({}));
  const std::string a = sim.AddWorker();
  const std::string b = sim.AddWorker();
  ASSERT_TRUE(sim.Heartbeat(a).ok());

  v1::DatasetInfo other = sim.dataset();
  other.set_fingerprint("fingerprint-2");
  absl::StatusOr<v1::HeartbeatResponse> hb = sim.Heartbeat(b, other);
  EXPECT_EQ(CodeOf(hb), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(MessageOf(hb), HasSubstr("fingerprint-2"));

  other = sim.dataset();
  other.set_samples(sim.dataset().samples() + 1);
  EXPECT_EQ(CodeOf(sim.Heartbeat(b, other)), absl::StatusCode::kFailedPrecondition);

  other.set_samples(0);
  EXPECT_EQ(CodeOf(sim.Heartbeat(b, other)), absl::StatusCode::kInvalidArgument);

  EXPECT_EQ(sim.state(), v1::PENDING);
  EXPECT_FALSE(sim.machine().Workers()[1].state() == v1::READY);
  hb = sim.Heartbeat(b);  // the right data is accepted
  ASSERT_TRUE(hb.ok());
  EXPECT_EQ(sim.state(), v1::RUNNING);
}

// Catches: the config a llama job's workers built their model from not kept in the job (so
// `job get` cannot show it, or it is gone after a coordinator restart), or a worker that read a
// different config.json accepted into the job.
TEST(StepMachineTest, ModelConfigRecordedOnceAndEnforced) {
  SimulatedRanks sim(ResolvedSpec({}));
  const std::string a = sim.AddWorker();
  const std::string b = sim.AddWorker();
  v1::DatasetInfo with_config = sim.dataset();
  (*with_config.mutable_model_config()->mutable_fields())["hidden_size"].set_number_value(576);
  EXPECT_EQ(sim.job().model_config().fields_size(), 0);
  ASSERT_TRUE(sim.Heartbeat(a, with_config).ok());
  EXPECT_EQ(sim.job().model_config().fields().at("hidden_size").number_value(), 576);

  v1::DatasetInfo other = with_config;
  (*other.mutable_model_config()->mutable_fields())["hidden_size"].set_number_value(960);
  absl::StatusOr<v1::HeartbeatResponse> hb = sim.Heartbeat(b, other);
  EXPECT_EQ(CodeOf(hb), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(MessageOf(hb), HasSubstr("model_config"));
  // Without a config at all (an older worker, or another model) is a different model too.
  EXPECT_EQ(CodeOf(sim.Heartbeat(b)), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(sim.job().model_config().fields().at("hidden_size").number_value(), 576);

  // A hostile report cannot grow the job without bound.
  v1::DatasetInfo huge = with_config;
  (*huge.mutable_model_config()->mutable_fields())["x"].set_string_value(std::string(70000, 'x'));
  EXPECT_EQ(CodeOf(sim.Heartbeat(b, huge)), absl::StatusCode::kInvalidArgument);

  ASSERT_TRUE(sim.Heartbeat(b, with_config).ok());
  EXPECT_EQ(sim.state(), v1::RUNNING);

  JobRegistry replayed{MachineOptions{}};
  for (const v1::JournalRecord& r : sim.records()) ASSERT_TRUE(replayed.Apply(r).ok());
  EXPECT_EQ((*replayed.Machine(sim.job_id()))->Job().model_config().DebugString(),
            sim.job().model_config().DebugString());
  sim.registry().Restore(sim.registry().Snapshot(), sim.now());
  EXPECT_EQ(sim.job().model_config().fields().at("hidden_size").number_value(), 576);
}

// ---------------------------------------------------------------------------------------
// The begin barrier

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

// ---------------------------------------------------------------------------------------
// Decisions

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

// Catches: a restored machine that forgets the desync streak (a crash-looping coordinator
// would retry a diverged job forever).
TEST(StepMachineTest, DesyncStreakSurvivesRestore) {
  SimulatedRanks sim(ResolvedSpec({}));
  sim.Start(2);
  RankReport good;
  RankReport bad = good;
  bad.grad_norm = 7.0;
  sim.RunWindow({good, bad});
  sim.RunWindow({good, bad});
  sim.registry().Restore(sim.registry().Snapshot(), sim.now());
  EXPECT_EQ(sim.state(), v1::RUNNING);
  sim.RunWindow({good, bad});
  EXPECT_EQ(sim.state(), v1::FAILED);
}

// ---------------------------------------------------------------------------------------
// Held-out evaluation (spec.eval)

SpecOptions WithEval(int64_t every, SpecOptions o = {}) {
  o.eval_every = every;
  return o;
}

std::vector<v1::EvalEnded> EvalRecords(const std::vector<v1::JournalRecord>& records) {
  std::vector<v1::EvalEnded> out;
  for (const v1::JournalRecord& r : records) {
    if (r.has_eval_ended()) out.push_back(r.eval_ended());
  }
  return out;
}

// Catches a journaled evaluation of an update that was never committed becoming the job's
// latest eval loss after replay, but not after a restore from the snapshot that replay
// writes (the journal_replay fuzzer's finding): it fits nothing and changes nothing.
TEST(StepMachineTest, AnEvaluationOfNoCommittedUpdateChangesNothing) {
  SimulatedRanks sim(ResolvedSpec(WithEval(1)));
  sim.Start(2);
  ASSERT_EQ(sim.RunWindow().outcome(), v1::COMMIT);
  const std::string before = sim.registry().Snapshot().DebugString();
  v1::JournalRecord record;
  record.set_time_ms(absl::ToUnixMillis(sim.now()));
  v1::EvalEnded* e = record.mutable_eval_ended();
  e->set_job_id(sim.job_id());
  e->set_generation(1);
  e->set_optimizer_update_id(7);
  e->set_eval_loss(0.0);
  ASSERT_TRUE(sim.registry().Apply(record).ok());
  EXPECT_FALSE(sim.progress().has_last_eval_loss());
  EXPECT_EQ(sim.registry().Snapshot().DebugString(), before);
}

// Catches: an eval loss that is a mean of the ranks' means (2.0 here) instead of Σ loss ÷ Σ
// tokens (1.0), an evaluation asked for off its interval, a next window that starts before the
// evaluation is recorded, and a result that never reaches the update's record and the progress.
TEST(StepMachineTest, EvalAtItsIntervalIsTokenWeightedAndGatesTheNextWindow) {
  SimulatedRanks sim(ResolvedSpec(WithEval(2)));
  sim.Start(2);
  EXPECT_FALSE(sim.RunWindow().run_eval());
  const v1::WindowDecision d2 = sim.RunWindow();
  ASSERT_EQ(d2.optimizer_update_id(), 2);
  ASSERT_TRUE(d2.run_eval());
  // Watchers get the commit only with its evaluation.
  EXPECT_EQ(sim.machine().WatchableUpdates(), sim.machine().updates().size() - 1);

  // Window 3's begin barrier waits for the evaluation.
  ASSERT_TRUE(sim.Begin(0, 3, 10)->ready == false);
  ASSERT_TRUE(sim.Begin(1, 3, 10)->ready == false);

  auto e0 = sim.Eval(0, 2, /*loss_sum=*/30.0, /*units=*/10);  // mean 3.0
  ASSERT_TRUE(e0.ok()) << e0.status();
  EXPECT_FALSE(e0->ready);
  EXPECT_TRUE(EvalRecords(sim.records()).empty());            // nothing half recorded
  auto e1 = sim.Eval(1, 2, /*loss_sum=*/10.0, /*units=*/30);  // mean 0.33
  ASSERT_TRUE(e1.ok()) << e1.status();
  ASSERT_TRUE(e1->ready);
  EXPECT_DOUBLE_EQ(e1->response.eval_loss(), 1.0);
  EXPECT_EQ(e1->response.valid_units(), 40);
  // The first rank's repeated call gets the same answer.
  auto again = sim.Eval(0, 2, 30.0, 10);
  ASSERT_TRUE(again.ok() && again->ready);
  EXPECT_DOUBLE_EQ(again->response.eval_loss(), 1.0);

  const std::vector<v1::EvalEnded> evals = EvalRecords(sim.records());
  ASSERT_EQ(evals.size(), 1u);
  EXPECT_EQ(evals[0].optimizer_update_id(), 2);
  EXPECT_EQ(evals[0].generation(), 1);
  const v1::UpdateRecord& r = sim.machine().updates().back();
  EXPECT_EQ(r.optimizer_update_id(), 2);
  ASSERT_TRUE(r.has_eval_loss());
  EXPECT_DOUBLE_EQ(r.eval_loss(), 1.0);
  EXPECT_EQ(r.eval_valid_tokens(), 40);
  EXPECT_FALSE(sim.machine().updates().front().has_eval_loss());
  EXPECT_EQ(sim.machine().WatchableUpdates(), sim.machine().updates().size());
  EXPECT_DOUBLE_EQ(sim.progress().last_eval_loss(), 1.0);
  EXPECT_EQ(sim.progress().last_eval_update_id(), 2);

  auto begin = sim.Begin(0, 3, 10);  // asked again: the barrier is complete now
  ASSERT_TRUE(begin.ok());
  EXPECT_TRUE(begin->ready);
}

// Catches: a job that ends before its final evaluation, or a final update that is never
// evaluated because it is off the interval.
TEST(StepMachineTest, FinalUpdateIsEvaluatedBeforeTheJobEnds) {
  SpecOptions o = WithEval(2);
  o.max_updates = 3;
  SimulatedRanks sim(ResolvedSpec(o));
  sim.Start(2);
  sim.RunWindow();
  ASSERT_TRUE(sim.RunWindow().run_eval());
  ASSERT_TRUE(sim.Eval(0, 2, 1, 1)->ready == false);
  ASSERT_TRUE(sim.Eval(1, 2, 1, 1)->ready);
  const v1::WindowDecision d3 = sim.RunWindow();
  ASSERT_TRUE(d3.job_done());
  EXPECT_TRUE(d3.run_eval());  // 3 is off the interval, but it is the last update
  EXPECT_EQ(sim.state(), v1::RUNNING);
  ASSERT_FALSE(sim.Eval(0, 3, 4, 2)->ready);
  EXPECT_EQ(sim.state(), v1::RUNNING);
  ASSERT_TRUE(sim.Eval(1, 3, 2, 2)->ready);
  EXPECT_EQ(sim.state(), v1::SUCCEEDED);
  EXPECT_DOUBLE_EQ(sim.progress().last_eval_loss(), 1.5);
  EXPECT_EQ(sim.progress().last_eval_update_id(), 3);
}

// A rank lost during the evaluation: like a window, nothing of it is recorded, the survivors'
// barrier answers ABORTED, and the next generation evaluates the same update again.
// Catches: an eval loss recorded from part of the ranks, a stale generation's report counted,
// and an evaluation that is silently dropped after a failure.
TEST(StepMachineTest, RankLostDuringEvalRecordsNothingAndTheNextGenerationRetries) {
  SimulatedRanks sim(ResolvedSpec(WithEval(1)));
  const std::vector<std::string> g1 = sim.Start(2);
  const std::string standby = sim.AddWorker();
  ASSERT_TRUE(sim.Heartbeat(standby).ok());
  ASSERT_TRUE(sim.RunWindow().run_eval());
  const v1::ReportEvalRequest rank0 = [&] {
    v1::ReportEvalRequest req;
    req.set_job_id(sim.job_id());
    req.set_worker_id(g1[0]);
    req.set_generation(1);
    req.set_rank(0);
    req.set_optimizer_update_id(1);
    req.set_loss_sum(5);
    req.set_valid_units(5);
    return req;
  }();
  ASSERT_FALSE(sim.Eval(rank0)->ready);
  sim.Lose({g1[1]});

  EXPECT_TRUE(EvalRecords(sim.records()).empty());
  EXPECT_EQ(CodeOf(sim.Eval(rank0)), absl::StatusCode::kAborted);
  EXPECT_EQ(sim.generation(), 2);
  absl::StatusOr<v1::HeartbeatResponse> hb = sim.Heartbeat(g1[0]);
  ASSERT_TRUE(hb.ok() && hb->assigned());
  EXPECT_EQ(hb->assignment().pending_eval_update_id(), 1);
  EXPECT_EQ(hb->assignment().next_window_id(), 2);
  EXPECT_FALSE(sim.progress().has_last_eval_loss());

  ASSERT_FALSE(sim.Eval(0, 1, 6, 3)->ready);
  auto done = sim.Eval(1, 1, 2, 1);
  ASSERT_TRUE(done.ok() && done->ready);
  EXPECT_DOUBLE_EQ(done->response.eval_loss(), 2.0);
  const std::vector<v1::EvalEnded> evals = EvalRecords(sim.records());
  ASSERT_EQ(evals.size(), 1u);
  EXPECT_EQ(evals[0].generation(), 2);
  EXPECT_EQ(sim.RunWindow().outcome(), v1::COMMIT);
}

// Catches: a commit whose evaluation a lost rank interrupted, released to watchers without its
// eval_loss because the next window's abort was logged after it (the result came too late).
TEST(StepMachineTest, AbortAfterACommitBeingEvaluatedWaitsForTheEvaluationToo) {
  SimulatedRanks sim(ResolvedSpec(WithEval(2)));
  const std::vector<std::string> g1 = sim.Start(2);
  const std::string standby = sim.AddWorker();
  ASSERT_TRUE(sim.Heartbeat(standby).ok());
  sim.RunWindow();
  ASSERT_TRUE(sim.RunWindow().run_eval());
  // Both ranks begin window 3 (it waits for the evaluation); rank 1 is lost: window 3 aborts.
  ASSERT_FALSE(sim.Begin(0, 3, 10)->ready);
  ASSERT_FALSE(sim.Begin(1, 3, 10)->ready);
  sim.Lose({g1[1]});
  const std::vector<v1::UpdateRecord>& log = sim.machine().updates();
  ASSERT_EQ(log.size(), 3u);
  ASSERT_EQ(OutcomeOf(log[2]), v1::ABORT);
  EXPECT_EQ(sim.machine().WatchableUpdates(), 1u);  // update 2 and the abort after it wait

  ASSERT_EQ(sim.generation(), 2);
  ASSERT_TRUE(sim.Heartbeat(g1[0])->assigned());
  ASSERT_FALSE(sim.Eval(0, 2, 6, 3)->ready);
  ASSERT_TRUE(sim.Eval(1, 2, 2, 1)->ready);
  EXPECT_DOUBLE_EQ(log[1].eval_loss(), 2.0);
  EXPECT_EQ(sim.machine().WatchableUpdates(), 3u);
}

// Catches: an evaluation state lost on a coordinator restart (replay or snapshot): the result
// must stay on its record, and an evaluation in progress must still gate the next window.
TEST(StepMachineTest, EvalSurvivesReplayAndSnapshot) {
  SimulatedRanks sim(ResolvedSpec(WithEval(1)));
  sim.Start(2);
  sim.RunWindow();
  ASSERT_TRUE(sim.Eval(0, 1, 3, 1)->ready == false);
  ASSERT_TRUE(sim.Eval(1, 1, 1, 1)->ready);
  sim.RunWindow();  // update 2: its evaluation is due

  // Replay the journal into a fresh registry.
  JobRegistry replayed{MachineOptions{}};
  for (const v1::JournalRecord& r : sim.records()) {
    const absl::Status applied = replayed.Apply(r);
    ASSERT_TRUE(applied.ok()) << applied;
  }
  const StepMachine& m = **replayed.Machine(sim.job_id());
  ASSERT_EQ(m.updates().size(), 2u);
  EXPECT_DOUBLE_EQ(m.updates()[0].eval_loss(), 2.0);
  EXPECT_FALSE(m.updates()[1].has_eval_loss());
  EXPECT_EQ(m.WatchableUpdates(), 1u);  // update 2 still waits for its evaluation
  EXPECT_EQ(m.Job().progress().last_eval_update_id(), 1);

  // Restore from a snapshot: the due evaluation gates window 3 and completes as before.
  sim.registry().Restore(sim.registry().Snapshot(), sim.now());
  EXPECT_DOUBLE_EQ(sim.progress().last_eval_loss(), 2.0);
  EXPECT_FALSE(sim.Begin(0, 3, 10)->ready);
  EXPECT_FALSE(sim.Begin(1, 3, 10)->ready);
  ASSERT_FALSE(sim.Eval(0, 2, 1, 1)->ready);
  ASSERT_TRUE(sim.Eval(1, 2, 1, 1)->ready);
  EXPECT_TRUE(sim.Begin(1, 3, 10)->ready);
  EXPECT_DOUBLE_EQ(sim.machine().updates()[1].eval_loss(), 1.0);
}

// Catches: evaluations asked for in a job without spec.eval, and reports for an update whose
// evaluation is not due being accepted.
TEST(StepMachineTest, EvalReportsOutsideTheProtocolAreRefused) {
  SimulatedRanks plain(ResolvedSpec({}));
  plain.Start(2);
  EXPECT_FALSE(plain.RunWindow().run_eval());
  EXPECT_EQ(CodeOf(plain.Eval(0, 1, 1, 1)), absl::StatusCode::kFailedPrecondition);

  SimulatedRanks sim(ResolvedSpec(WithEval(2)));
  sim.Start(2);
  sim.RunWindow();
  EXPECT_THAT(MessageOf(sim.Eval(0, 1, 1, 1)), HasSubstr("no evaluation of update 1 is due"));
  sim.RunWindow();
  EXPECT_EQ(CodeOf(sim.Eval(0, 2, 1, -1)), absl::StatusCode::kInvalidArgument);
  ASSERT_FALSE(sim.Eval(0, 2, 1, 1)->ready);
  EXPECT_EQ(CodeOf(sim.Eval(0, 2, 9, 1)), absl::StatusCode::kInvalidArgument);  // changed report
}

// Catches: an evaluation of an update that a rollback erased staying due (it would block the
// job forever, or be recorded against weights that no longer exist).
TEST(StepMachineTest, RollbackPastADueEvalClearsIt) {
  SpecOptions o = WithEval(2);
  o.checkpoint_dir = "/ckpt";
  o.every_updates = 1;
  SimulatedRanks sim(ResolvedSpec(o));
  const std::vector<std::string> g1 = sim.Start(2);
  const v1::WindowDecision d1 = sim.RunWindow();
  ASSERT_TRUE(sim.Ack(d1.checkpoint_id(), 1).ok());
  ASSERT_TRUE(sim.RunWindow().run_eval());  // update 2, checkpoint never acknowledged
  sim.Lose(g1);
  sim.Start(2);
  EXPECT_EQ(sim.progress().optimizer_update_id(), 1);
  absl::StatusOr<v1::HeartbeatResponse> hb = sim.Heartbeat(sim.Ranks()[0]);
  ASSERT_TRUE(hb.ok() && hb->assigned());
  EXPECT_FALSE(hb->assignment().has_pending_eval_update_id());
  const v1::WindowDecision again = sim.RunWindow();  // update 2 again: evaluated again
  EXPECT_EQ(again.optimizer_update_id(), 2);
  EXPECT_TRUE(again.run_eval());
}

// ---------------------------------------------------------------------------------------
// Idempotence and errors

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

// ---------------------------------------------------------------------------------------
// Lost workers

// Catches: a lost rank that does not abort the window in flight, a new generation that
// drops survivors or misorders them, a wrong state source, or a retry under another
// window id.
TEST(StepMachineTest, LeaseExpiryAbortsWindowAndRetriesInNewGeneration) {
  SpecOptions o;
  o.workers = 3;
  SimulatedRanks sim(ResolvedSpec(o));
  const std::vector<std::string> g1 = sim.Start(3);
  const std::string standby = sim.AddWorker();
  ASSERT_TRUE(sim.Heartbeat(standby).ok());
  ASSERT_EQ(sim.RunWindow(Reports(3)).outcome(), v1::COMMIT);

  sim.BeginAll(2, {10, 10, 10});
  ASSERT_FALSE(sim.Complete(1, 2, RankReport{})->ready);
  const v1::CompleteWindowRequest rank1_report = sim.CompleteRequest(1, 2, RankReport{});
  EXPECT_EQ(sim.machine().NextDeadline(), sim.now() + absl::Seconds(10));
  const size_t before = sim.records().size();
  sim.Lose({g1[0]});  // rank 0 dies mid-window

  // The records: the abort, the loss, the new generation, in that order.
  std::vector<v1::JournalRecord> fresh(sim.records().begin() + before, sim.records().end());
  ASSERT_EQ(fresh.size(), 3u);
  ASSERT_TRUE(fresh[0].has_window_ended());
  const v1::WindowDecision& abort = fresh[0].window_ended().decision();
  EXPECT_EQ(abort.outcome(), v1::ABORT);
  EXPECT_EQ(abort.reason(), "WORKER_LOST");
  EXPECT_EQ(abort.record().window_id(), 2);
  EXPECT_EQ(abort.record().generation(), 1);
  EXPECT_EQ(abort.record().global_valid_tokens(), 30);
  EXPECT_EQ(abort.optimizer_update_id(), 1);
  ASSERT_TRUE(fresh[1].has_worker_lost());
  EXPECT_EQ(fresh[1].worker_lost().worker_id(), g1[0]);
  ASSERT_TRUE(fresh[2].has_generation_formed());
  const v1::GenerationFormed& f = fresh[2].generation_formed();
  EXPECT_EQ(f.generation(), 2);
  EXPECT_THAT(f.worker_ids(), ElementsAre(g1[1], g1[2], standby));  // survivors first
  EXPECT_EQ(f.assignment().state_source(), v1::Assignment::BROADCAST);
  EXPECT_EQ(f.assignment().source_rank(), 0);
  EXPECT_EQ(f.assignment().next_window_id(), 2);
  EXPECT_EQ(f.assignment().optimizer_update_id(), 1);
  EXPECT_EQ(f.assignment().scheduler_step(), 1);
  EXPECT_FALSE(f.rolled_back());

  // The survivor that had reported learns of the abort by asking again.
  auto again = sim.Complete(rank1_report);
  ASSERT_TRUE(again.ok());
  ASSERT_TRUE(again->ready);
  EXPECT_EQ(again->response.decision().outcome(), v1::ABORT);
  // The lost worker is fenced off: NOT_FOUND tells it to register again (a new identity).
  EXPECT_EQ(CodeOf(sim.Heartbeat(g1[0])), absl::StatusCode::kNotFound);
  EXPECT_THAT(MessageOf(sim.Heartbeat(g1[0])), HasSubstr("declared lost"));

  const v1::JobProgress p = sim.progress();
  EXPECT_EQ(p.window_id(), 1);
  EXPECT_EQ(p.optimizer_update_id(), 1);
  EXPECT_EQ(p.windows_aborted(), 1);
  const v1::WindowDecision retry = sim.RunWindow(Reports(3));
  EXPECT_EQ(retry.outcome(), v1::COMMIT);
  EXPECT_EQ(retry.record().window_id(), 2);
  EXPECT_EQ(retry.record().generation(), 2);
  EXPECT_EQ(retry.optimizer_update_id(), 2);
}

// Catches: a generation formed with fewer workers than workers.count, a lost worker with
// no window in flight that leaves an ABORT record, or a job that never resumes when a
// replacement joins.
TEST(StepMachineTest, LostWorkerWithoutStandbyWaitsForReplacement) {
  SimulatedRanks sim(ResolvedSpec({}));
  const std::vector<std::string> g1 = sim.Start(2);
  ASSERT_EQ(sim.RunWindow().outcome(), v1::COMMIT);
  sim.Lose({g1[1]});
  EXPECT_EQ(sim.progress().windows_aborted(), 0);  // nothing was in flight
  EXPECT_EQ(sim.generation(), 1);
  EXPECT_EQ(sim.state(), v1::RUNNING);
  EXPECT_EQ(CodeOf(sim.Begin(0, 2, 10)), absl::StatusCode::kAborted);  // generation 1 is over
  auto hb = sim.Heartbeat(g1[0]);
  ASSERT_TRUE(hb.ok());
  EXPECT_FALSE(hb->assigned());

  const std::string fresh = sim.AddWorker();
  ASSERT_TRUE(sim.Heartbeat(fresh).ok());
  EXPECT_EQ(sim.generation(), 2);
  EXPECT_THAT(sim.Ranks(), ElementsAre(g1[0], fresh));
  hb = sim.Heartbeat(fresh);
  ASSERT_TRUE(hb->assigned());
  EXPECT_EQ(hb->assignment().state_source(), v1::Assignment::BROADCAST);
  EXPECT_EQ(hb->assignment().next_window_id(), 2);
  EXPECT_EQ(sim.RunWindow().record().window_id(), 2);
}

// Catches: all replicas lost after updates without a rollback to the latest durable
// checkpoint (ids, tokens and scale must return to that checkpoint's).
TEST(StepMachineTest, AllLostRollsBackToDurableCheckpoint) {
  SimulatedRanks sim(ResolvedSpec(WithCheckpoints(2, Fp16(1024, 3))));
  const std::vector<std::string> g1 = sim.Start(2);
  ASSERT_TRUE(sim.RunWindow().write_checkpoint() == false);
  const v1::WindowDecision d2 = sim.RunWindow();
  ASSERT_TRUE(d2.write_checkpoint());
  ASSERT_TRUE(sim.Ack(d2.checkpoint_id(), 2).ok());
  const double scale_at_ckpt = sim.progress().loss_scale();
  RankReport inf;
  inf.found_inf = true;
  sim.RunWindow(Reports(2, inf));                 // window 3: skip, scale backs off
  sim.RunWindow();                                // window 4: update 3
  const v1::WindowDecision d5 = sim.RunWindow();  // update 4: checkpoint 2, never acked
  ASSERT_TRUE(d5.write_checkpoint());
  ASSERT_EQ(sim.progress().optimizer_update_id(), 4);
  ASSERT_NE(sim.progress().loss_scale(), scale_at_ckpt);

  sim.Lose(g1);
  EXPECT_EQ(sim.state(), v1::RUNNING);
  EXPECT_EQ(sim.progress().optimizer_update_id(), 4);  // not rolled back until a generation forms
  const size_t before = sim.records().size();
  const std::vector<std::string> g2 = sim.Start(2);
  const v1::GenerationFormed* f = nullptr;
  for (size_t i = before; i < sim.records().size(); ++i) {
    if (sim.records()[i].has_generation_formed()) f = &sim.records()[i].generation_formed();
  }
  ASSERT_NE(f, nullptr);
  EXPECT_TRUE(f->rolled_back());
  EXPECT_EQ(f->rollback_to().checkpoint_id(), d2.checkpoint_id());
  EXPECT_EQ(f->assignment().state_source(), v1::Assignment::CHECKPOINT);
  EXPECT_EQ(f->assignment().checkpoint_id(), d2.checkpoint_id());
  EXPECT_EQ(f->assignment().optimizer_update_id(), 2);
  EXPECT_EQ(f->assignment().scheduler_step(), 2);
  EXPECT_EQ(f->assignment().next_window_id(), 3);
  EXPECT_FALSE(f->assignment().has_pending_checkpoint_id());  // checkpoint 1 is durable

  const v1::JobProgress p = sim.progress();
  EXPECT_EQ(p.generation(), 2);
  EXPECT_EQ(p.rollbacks(), 1);  // counted for `job get` and the chaos tool's judgement
  EXPECT_EQ(p.window_id(), 2);
  EXPECT_EQ(p.optimizer_update_id(), 2);
  EXPECT_EQ(p.scheduler_step(), 2);
  EXPECT_EQ(p.cumulative_tokens(), 40);
  EXPECT_EQ(p.checkpoint_id(), d2.checkpoint_id());
  EXPECT_EQ(p.durable_checkpoint_id(), d2.checkpoint_id());
  EXPECT_EQ(p.loss_scale(), scale_at_ckpt);
  // Checkpoint 2 of the lost state can never be acknowledged.
  EXPECT_EQ(CodeOf(sim.Ack(d5.checkpoint_id(), 4, g2[0])), absl::StatusCode::kNotFound);

  const v1::WindowDecision next = sim.RunWindow();
  EXPECT_EQ(next.record().window_id(), 3);
  EXPECT_EQ(next.optimizer_update_id(), 3);
  const v1::WindowDecision ck = sim.RunWindow();
  ASSERT_TRUE(ck.write_checkpoint());
  EXPECT_GT(ck.checkpoint_id(), d5.checkpoint_id());  // checkpoint ids are never reused
}

// The rule: while a replica that holds the current update may be alive, the job never
// rolls back — also right after a coordinator restart, when nobody has said yet what it holds.
// Catches: a restarted coordinator rolling back to the last durable checkpoint because a worker
// was lost before the survivors (busy applying the decision they got from the re-sent report)
// reported the update they hold — the outside probe saw 6 such rollbacks redo 35 updates.
TEST(StepMachineTest, RestartedCoordinatorDoesNotRollBackWhileSurvivorsMayHoldTheUpdate) {
  SpecOptions three = WithCheckpoints(2, Fp16(1024, 3));
  three.workers = 3;
  SimulatedRanks job(ResolvedSpec(three));
  const std::vector<std::string> ids = job.Start(4);  // three ranks and a spare
  ASSERT_EQ(job.Ranks().size(), 3u);
  job.RunWindow();
  const v1::WindowDecision d2 = job.RunWindow();
  ASSERT_TRUE(d2.write_checkpoint());
  ASSERT_TRUE(job.Ack(d2.checkpoint_id(), 2).ok());
  ASSERT_EQ(job.RunWindow().optimizer_update_id(), 3);
  const std::vector<std::string> ranks = job.Ranks();
  std::string spare;
  for (const std::string& id : ids) {
    if (std::find(ranks.begin(), ranks.end(), id) == ranks.end()) spare = id;
  }

  // The coordinator restarts; ranks 1 and 2 speak first with what they held before the
  // decision of update 3 reached them, and rank 0 never comes back.
  job.registry().Restore(job.registry().Snapshot(), job.now());
  job.registry().Recovered(job.now());
  const size_t before = job.records().size();
  for (int i = 0; i < 2; ++i) {
    job.Advance(job.options().reconnect_grace / 2);
    for (const std::string& id : {ranks[1], ranks[2]}) ASSERT_TRUE(job.HeartbeatAs(id, 2).ok());
    ASSERT_TRUE(job.HeartbeatAs(spare, 0, /*idle_after=*/0).ok());
    job.Tick();
  }
  ASSERT_EQ(job.machine().Workers()[0].state(), v1::LOST);  // rank 0 never reconnected
  EXPECT_TRUE(job.FormedSince(before).empty()) << "formed a generation before the survivors spoke";
  EXPECT_EQ(job.progress().optimizer_update_id(), 3);

  // Rank 1 has applied update 3 and waits for the next generation: it seeds it.
  ASSERT_TRUE(job.HeartbeatAs(ranks[1], 3, /*idle_after=*/1).ok());
  const std::vector<v1::GenerationFormed> formed = job.FormedSince(before);
  ASSERT_EQ(formed.size(), 1u);
  EXPECT_FALSE(formed[0].rolled_back());
  EXPECT_EQ(formed[0].assignment().state_source(), v1::Assignment::BROADCAST);
  EXPECT_EQ(formed[0].worker_ids(0), ranks[1]);
  EXPECT_EQ(formed[0].assignment().optimizer_update_id(), 3);
  EXPECT_EQ(job.progress().rollbacks(), 0);
  EXPECT_EQ(job.RunWindow().optimizer_update_id(), 4);
}

// Catches: a rank that gave its generation up (its collective failed) while the coordinator
// still counts it: the others wait at the barrier for it for ever. Its idle heartbeat ends the
// generation at once — with an ABORT when a window was in flight — and the next one forms.
TEST(StepMachineTest, ARankWaitingForALaterGenerationEndsTheCurrentOne) {
  SimulatedRanks sim(ResolvedSpec({}));
  sim.Start(2);
  ASSERT_EQ(sim.RunWindow().outcome(), v1::COMMIT);
  const std::vector<std::string> g1 = sim.Ranks();
  ASSERT_FALSE(sim.Begin(0, 2, 10)->ready);
  size_t before = sim.records().size();
  ASSERT_TRUE(sim.HeartbeatAs(g1[1], 1, /*idle_after=*/1).ok());
  ASSERT_EQ(sim.machine().updates().back().outcome(), "abort");
  EXPECT_EQ(sim.machine().updates().back().reason(), "WORKER_LOST");
  // Both replicas hold update 1 and are alive: the same two form generation 2 (rank 0 once it
  // too says it is idle, or at once — it holds the update).
  std::vector<v1::GenerationFormed> formed = sim.FormedSince(before);
  ASSERT_EQ(formed.size(), 1u);
  EXPECT_EQ(formed[0].generation(), 2);
  EXPECT_FALSE(formed[0].rolled_back());
  EXPECT_EQ(sim.RunWindow().optimizer_update_id(), 2);

  // Between windows (nothing in flight) the generation ends through its own record.
  before = sim.records().size();
  ASSERT_TRUE(sim.HeartbeatAs(sim.Ranks()[0], 2, /*idle_after=*/2).ok());
  bool left = false;
  for (size_t i = before; i < sim.records().size(); ++i) {
    left |= sim.records()[i].has_generation_ended();
  }
  EXPECT_TRUE(left);
  EXPECT_EQ(sim.generation(), 3);
  // A stale idle heartbeat from before generation 3 ends nothing.
  before = sim.records().size();
  ASSERT_TRUE(sim.HeartbeatAs(sim.Ranks()[1], 2, /*idle_after=*/2).ok());
  EXPECT_EQ(sim.generation(), 3);
  EXPECT_TRUE(sim.FormedSince(before).empty());
}

// Catches a dead process costing a whole lease: a dropped Attach stream ends the worker's lease
// after the short grace — unless it attaches again or heartbeats, and only for its latest stream.
TEST(StepMachineTest, DroppedAttachStreamLosesTheWorkerAfterTheGrace) {
  MachineOptions options;
  options.detach_grace = absl::Milliseconds(300);
  SimulatedRanks sim(ResolvedSpec({}), options);
  const std::vector<std::string> ids = sim.Start(3);  // two ranks and a spare
  ASSERT_EQ(sim.RunWindow().outcome(), v1::COMMIT);
  const std::vector<std::string> g1 = sim.Ranks();
  auto attach = [&](const std::string& id, uint64_t seq) {
    v1::AttachRequest req;
    req.set_job_id(sim.job_id());
    req.set_worker_id(id);
    return sim.machine().Attach(req, seq, sim.now());
  };
  ASSERT_TRUE(attach(g1[0], 1).ok());
  ASSERT_TRUE(attach(g1[1], 2).ok());
  ASSERT_TRUE(attach(g1[1], 3).ok());  // g1[1] re-attached; stream 2 ends late

  sim.machine().Detached(g1[1], 2, sim.now());  // not its latest stream: nothing changes
  sim.machine().Detached(g1[0], 1, sim.now());
  ASSERT_EQ(sim.machine().NextDeadline(), sim.now() + absl::Milliseconds(300));
  sim.Advance(absl::Milliseconds(299));
  ASSERT_TRUE(sim.Heartbeat(g1[1]).ok());  // the survivor says it holds update 1
  sim.Tick();
  EXPECT_EQ(sim.Ranks(), g1);
  sim.Advance(absl::Milliseconds(1));
  sim.Tick();
  EXPECT_EQ(sim.generation(), 2);
  EXPECT_EQ(sim.machine().updates().size(), 1u);  // nothing was in flight
  EXPECT_EQ(CodeOf(attach(g1[0], 4).status()), absl::StatusCode::kNotFound);

  // A worker whose stream dropped but which heartbeats within the grace keeps its lease.
  const std::string rank0 = sim.Ranks()[0];
  ASSERT_TRUE(attach(rank0, 5).ok());
  sim.machine().Detached(rank0, 5, sim.now());
  sim.Advance(absl::Milliseconds(100));
  ASSERT_TRUE(sim.Heartbeat(rank0).ok());
  sim.Advance(absl::Seconds(1));
  sim.Tick();
  for (const v1::WorkerInfo& w : sim.machine().Workers()) {
    if (w.worker_id() == rank0) EXPECT_EQ(w.state(), v1::ACTIVE);
  }
  EXPECT_EQ(sim.generation(), 2);
}

// Catches the churn seen with real processes: a rank's collective fails the moment its peer
// dies, it gives the generation up, and the next generation was formed at once with the dead
// peer (its stream had dropped, its grace not yet run out) — and broke again 300 ms later.
TEST(StepMachineTest, ANewGenerationIsNotBuiltOnADetachedWorker) {
  SimulatedRanks sim(ResolvedSpec({}));
  sim.Start(3);  // two ranks and a spare
  ASSERT_EQ(sim.RunWindow().outcome(), v1::COMMIT);
  const std::vector<std::string> g1 = sim.Ranks();
  v1::AttachRequest req;
  req.set_job_id(sim.job_id());
  req.set_worker_id(g1[1]);
  ASSERT_TRUE(sim.machine().Attach(req, 7, sim.now()).ok());
  sim.machine().Detached(g1[1], 7, sim.now());  // its process died
  const size_t before = sim.records().size();
  ASSERT_TRUE(sim.HeartbeatAs(g1[0], 1, /*idle_after=*/1).ok());  // its all-reduce failed
  const std::vector<v1::GenerationFormed> formed = sim.FormedSince(before);
  ASSERT_EQ(formed.size(), 1u);
  EXPECT_EQ(formed[0].worker_ids(0), g1[0]);
  EXPECT_NE(formed[0].worker_ids(1), g1[1]);  // the spare, not the detached worker
  EXPECT_FALSE(formed[0].rolled_back());
}

// Catches a rank blocked in the collective's rendezvous for a generation that is over waiting
// until its deadline (seconds) instead of rejoining at once.
TEST(StepMachineTest, RendezvousReadsOfAnEndedGenerationAreAborted) {
  SimulatedRanks sim(ResolvedSpec({}));
  const std::vector<std::string> ids = sim.Start(2);
  const std::string g1 = absl::StrCat(sim.job_id(), "/g1/rank_0");
  const std::string g2 = absl::StrCat(sim.job_id(), "/g2/rank_0");
  EXPECT_TRUE(sim.machine().CheckRendezvousKey(g1).ok());
  EXPECT_TRUE(sim.machine().CheckRendezvousKey(g2).ok());  // not formed yet: nothing to end
  EXPECT_TRUE(sim.machine().CheckRendezvousKey("unrelated").ok());
  sim.Lose({ids[1]});  // generation 1 breaks; no standby to form generation 2
  EXPECT_EQ(sim.machine().CheckRendezvousKey(g1).code(), absl::StatusCode::kAborted);
  sim.Start(1);
  ASSERT_EQ(sim.generation(), 2);
  EXPECT_EQ(sim.machine().CheckRendezvousKey(g1).code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(sim.machine().CheckRendezvousKey(g2).ok());
}

// Catches a worker that died while the coordinator was down costing a whole lease after the
// restart: it has the reconnect grace to be heard from; the live ones speak well within it.
TEST(StepMachineTest, AfterARestartAWorkerNotHeardFromIsLostAfterTheReconnectGrace) {
  MachineOptions options;
  options.reconnect_grace = absl::Seconds(3);
  SimulatedRanks sim(ResolvedSpec({}), options);
  const std::vector<std::string> ids = sim.Start(3);  // two ranks and a spare
  ASSERT_EQ(sim.RunWindow().outcome(), v1::COMMIT);
  const std::vector<std::string> g1 = sim.Ranks();
  sim.registry().Restore(sim.registry().Snapshot(), sim.now());
  sim.registry().Recovered(sim.now());
  sim.Advance(absl::Milliseconds(300));
  sim.HeartbeatAllExcept({g1[1]});  // g1[1] died with the coordinator
  sim.Advance(absl::Seconds(3) - absl::Milliseconds(300));
  sim.Tick();
  EXPECT_EQ(sim.generation(), 2);  // well before the 10 s lease
  for (const v1::WorkerInfo& w : sim.machine().Workers()) {
    if (w.worker_id() == g1[1]) EXPECT_EQ(w.state(), v1::LOST);
  }
  // The ones that attach again keep a whole lease.
  uint64_t seq = 0;
  for (const v1::WorkerInfo& w : sim.machine().Workers()) {
    if (w.state() == v1::LOST) continue;
    v1::AttachRequest attach;
    attach.set_job_id(sim.job_id());
    attach.set_worker_id(w.worker_id());
    ASSERT_TRUE(sim.machine().Attach(attach, ++seq, sim.now()).ok());
  }
  sim.Advance(absl::Seconds(5));
  sim.Tick();
  EXPECT_EQ(sim.generation(), 2);
}

// Catches the chaos campaign's 10 s restart_gap_kill recoveries: a rank heartbeated to the
// restarted coordinator and died before its Attach stream opened. The heartbeat renewed a
// whole lease, and nothing else could tell the coordinator it was gone.
TEST(StepMachineTest, AfterARestartAHeartbeatWithoutAttachRenewsOnlyTheReconnectGrace) {
  MachineOptions options;
  options.reconnect_grace = absl::Seconds(3);
  SimulatedRanks sim(ResolvedSpec({}), options);
  sim.Start(3);  // two ranks and a spare
  ASSERT_EQ(sim.RunWindow().outcome(), v1::COMMIT);
  const std::vector<std::string> g1 = sim.Ranks();
  sim.registry().Restore(sim.registry().Snapshot(), sim.now());
  sim.registry().Recovered(sim.now());
  sim.Advance(absl::Milliseconds(100));
  sim.HeartbeatAllExcept({});  // everyone speaks once; g1[1] then dies
  // A worker that keeps heartbeating without a stream (within the grace) stays.
  for (int i = 0; i < 3; ++i) {
    sim.Advance(absl::Seconds(2));
    sim.HeartbeatAllExcept({g1[1]});
    sim.Tick();
  }
  EXPECT_EQ(sim.generation(), 2);  // g1[1] lost ~3 s after its heartbeat, not at 10 s
  bool lost = false;
  for (const v1::WorkerInfo& w : sim.machine().Workers()) {
    if (w.worker_id() == g1[1]) lost = w.state() == v1::LOST;
    if (w.worker_id() != g1[1]) EXPECT_NE(w.state(), v1::LOST) << w.worker_id();
  }
  EXPECT_TRUE(lost);
}

// Catches the chaos tool's 120 s stall: a generation formed just before the coordinator was
// killed rendezvoused across the restart; the keys its ranks had set lived only in the old
// process's store, and the others waited for them until the store timeout.
TEST(StepMachineTest, RendezvousThatStraddledARestartEndsItsGeneration) {
  SimulatedRanks sim(ResolvedSpec({}));
  sim.Start(2);
  ASSERT_EQ(sim.generation(), 1);
  const std::string key = absl::StrCat(sim.job_id(), "/g1//0/rank_0");
  // Without a restart a missing key is only not set yet.
  EXPECT_TRUE(sim.machine().RendezvousKeyMissing(key, sim.now()).ok());
  sim.registry().Restore(sim.registry().Snapshot(), sim.now());
  sim.registry().Recovered(sim.now());
  sim.HeartbeatAllExcept({});  // the live ranks speak to the new coordinator at once
  EXPECT_TRUE(sim.machine().RendezvousKeyMissing("unrelated", sim.now()).ok());
  const size_t before = sim.records().size();
  EXPECT_EQ(sim.machine().RendezvousKeyMissing(key, sim.now()).code(), absl::StatusCode::kAborted);
  sim.Drain();
  bool ended = false;
  for (size_t i = before; i < sim.records().size(); ++i) {
    ended |= sim.records()[i].has_generation_ended();
  }
  EXPECT_TRUE(ended);
  EXPECT_EQ(sim.generation(), 2);  // formed again at once: nothing was trained yet
  // The new generation's keys are this coordinator's own: a missing one just waits.
  EXPECT_TRUE(sim.machine()
                  .RendezvousKeyMissing(absl::StrCat(sim.job_id(), "/g2//0/rank_0"), sim.now())
                  .ok());
  EXPECT_EQ(sim.RunWindow().outcome(), v1::COMMIT);
}

// --- Elastic world size ---

SpecOptions Elastic(int count, int min, const std::string& grace) {
  SpecOptions o;
  o.workers = count;
  o.min_workers = min;
  o.join_grace = grace;
  return o;
}

std::vector<v1::GenerationFormed> FormedWith(const SimulatedRanks& sim, size_t from, int world) {
  std::vector<v1::GenerationFormed> out;
  for (const v1::GenerationFormed& f : sim.FormedSince(from)) {
    if (f.worker_ids_size() == world) out.push_back(f);
  }
  return out;
}

// Catches: a job of workers.count 3 that loses a worker for good waiting for ever (the
// probe); and one that shrinks at once instead of giving a replacement the join grace.
TEST(StepMachineTest, ShortOfWorkersGoesOnWithFewerAfterTheJoinGrace) {
  SimulatedRanks sim(ResolvedSpec(Elastic(3, 2, "5s")));
  const std::vector<std::string> g1 = sim.Start(3);
  ASSERT_EQ(sim.RunWindow().optimizer_update_id(), 1);
  const size_t before = sim.records().size();
  sim.Lose({g1[2]});
  EXPECT_TRUE(sim.FormedSince(before).empty());  // the grace runs
  EXPECT_EQ(sim.progress().workers_available(), 2);
  EXPECT_NE(sim.progress().waiting().find("waiting for 1 more worker"), std::string::npos)
      << sim.progress().waiting();
  const absl::Time grace_end = sim.now() + absl::Seconds(5);
  ASSERT_TRUE(sim.machine().NextDeadline().has_value());
  EXPECT_LE(*sim.machine().NextDeadline(), grace_end);
  sim.Advance(absl::Seconds(5) - absl::Milliseconds(1));
  sim.HeartbeatAllExcept({});
  sim.Tick();
  EXPECT_TRUE(sim.FormedSince(before).empty());
  sim.Advance(absl::Milliseconds(1));
  sim.Tick();
  const std::vector<v1::GenerationFormed> formed = FormedWith(sim, before, 2);
  ASSERT_EQ(formed.size(), 1u);
  EXPECT_FALSE(formed[0].rolled_back());
  EXPECT_EQ(formed[0].assignment().state_source(), v1::Assignment::BROADCAST);
  EXPECT_TRUE(sim.progress().waiting().empty());
  const v1::WindowDecision d = sim.RunWindow();
  EXPECT_EQ(d.outcome(), v1::COMMIT);
  EXPECT_EQ(d.record().world_size(), 2);  // the log shows the change
  EXPECT_EQ(d.optimizer_update_id(), 2);
  // The grace is not a time the driver must keep waking for once it passed.
  const std::optional<absl::Time> next = sim.machine().NextDeadline();
  ASSERT_TRUE(next.has_value());
  EXPECT_GT(*next, sim.now());
}

// Catches: a job below workers.min training anyway, rolling back, or waiting silently; and a
// driver spinning on a past grace deadline meanwhile.
TEST(StepMachineTest, BelowMinWaitsVisiblyWithoutRollingBack) {
  SimulatedRanks sim(ResolvedSpec(Elastic(3, 2, "1s")));
  const std::vector<std::string> g1 = sim.Start(3);
  sim.RunWindow();
  sim.RunWindow();
  const size_t before = sim.records().size();
  sim.Lose({g1[1], g1[2]});
  sim.Advance(absl::Seconds(2));
  sim.HeartbeatAllExcept({});
  sim.Tick();
  EXPECT_TRUE(sim.FormedSince(before).empty());
  EXPECT_EQ(sim.progress().waiting(),
            "waiting for workers: 1 available, workers.min is 2 (workers.count 3)");
  const std::optional<absl::Time> next = sim.machine().NextDeadline();
  ASSERT_TRUE(next.has_value());
  EXPECT_GT(*next, sim.now());  // only the leases; the passed grace is not due again
  EXPECT_EQ(sim.progress().optimizer_update_id(), 2);

  // One worker comes back: the grace has long passed, so the survivor seeds a generation of 2.
  sim.Start(1);
  const std::vector<v1::GenerationFormed> formed = FormedWith(sim, before, 2);
  ASSERT_EQ(formed.size(), 1u);
  EXPECT_FALSE(formed[0].rolled_back());
  EXPECT_EQ(formed[0].worker_ids(0), g1[0]);
  EXPECT_EQ(formed[0].assignment().optimizer_update_id(), 2);
  EXPECT_EQ(sim.progress().rollbacks(), 0);
}

// Catches a coordinator restarted while a job waited for workers still saying "waiting for
// workers" once a generation formed: the snapshot's progress outlived what it described (the
// journal_replay fuzzer's finding: restored and replayed registries diverged).
TEST(StepMachineTest, WaitingForWorkersDoesNotOutliveARestart) {
  SimulatedRanks sim(ResolvedSpec(Elastic(3, 2, "1s")));
  const std::vector<std::string> g1 = sim.Start(3);
  sim.RunWindow();
  sim.Lose({g1[1], g1[2]});
  sim.Advance(absl::Seconds(2));
  sim.HeartbeatAllExcept({});
  sim.Tick();
  ASSERT_FALSE(sim.progress().waiting().empty());
  ASSERT_EQ(sim.progress().workers_available(), 1);

  sim.registry().Restore(sim.registry().Snapshot(), sim.now());
  sim.registry().Recovered(sim.now());
  sim.HeartbeatAllExcept({});
  sim.Start(1);  // a second worker: a generation of 2 forms once the join grace ends
  sim.Advance(absl::Seconds(1));
  sim.HeartbeatAllExcept({});
  sim.Tick();
  ASSERT_EQ(sim.progress().world_size(), 2);
  EXPECT_EQ(sim.progress().waiting(), "");
  EXPECT_EQ(sim.progress().workers_available(), 0);
}

// Catches: a shrunk job that never grows back, grows past workers.count, or grows in the middle
// of a window (its reports would be thrown away).
TEST(StepMachineTest, GrowsBackToCountAtAWindowBoundary) {
  SimulatedRanks sim(ResolvedSpec(Elastic(3, 1, "0s")));
  const std::vector<std::string> g1 = sim.Start(3);
  sim.RunWindow();
  sim.Lose({g1[1], g1[2]});  // grace 0: a generation of 1 at once
  ASSERT_EQ(sim.Ranks().size(), 1u);
  ASSERT_EQ(sim.RunWindow().record().world_size(), 1);

  // Two workers come back while window 3 is in flight: it ends in the generation of 1.
  ASSERT_TRUE(sim.Begin(0, 3, 10)->ready);
  sim.Start(2);
  ASSERT_EQ(sim.Ranks().size(), 1u);
  const size_t before = sim.records().size();
  auto c = sim.Complete(0, 3, RankReport{});
  ASSERT_TRUE(c.ok() && c->ready) << c.status();
  EXPECT_EQ(c->response.decision().outcome(), v1::COMMIT);
  // Then the generation ends and, once the member says it holds update 3, the next one has 3.
  EXPECT_TRUE(sim.FormedSince(before).empty());  // not before it applied update 3
  ASSERT_TRUE(sim.HeartbeatAs(g1[0], 3, /*idle_after=*/sim.generation()).ok());
  const std::vector<v1::GenerationFormed> formed = FormedWith(sim, before, 3);
  ASSERT_EQ(formed.size(), 1u);
  EXPECT_EQ(formed[0].worker_ids(0), g1[0]);
  EXPECT_EQ(formed[0].assignment().state_source(), v1::Assignment::BROADCAST);
  EXPECT_EQ(formed[0].assignment().next_window_id(), 4);
  EXPECT_EQ(sim.RunWindow().record().world_size(), 3);

  // More workers than workers.count: never more ranks than it.
  sim.Start(2);
  sim.RunWindow();
  EXPECT_EQ(sim.Ranks().size(), 3u);
}

// Three ranks; two are lost after window 1, and the one left begins window 2 alone (its
// barrier passes). Returns the first generation's worker ids.
std::vector<std::string> ShrunkToOneInWindow2(SimulatedRanks& sim) {
  const std::vector<std::string> g1 = sim.Start(3);
  sim.RunWindow();
  sim.Lose({g1[1], g1[2]});
  EXPECT_EQ(sim.Ranks().size(), 1u);
  auto begun = sim.Begin(0, 2, 10);
  EXPECT_TRUE(begun.ok() && begun->ready) << begun.status();
  return g1;
}

// Catches: growth held up for ever by pipelining. Every rank sends the next window's
// BeginWindow ahead, so that window always has begin reports when a window ends; they must not
// stop the generation from growing at the boundary (their calls are answered ABORTED).
TEST(StepMachineTest, GrowsAtAWindowBoundaryThoughTheNextWindowWasBegunAhead) {
  SimulatedRanks sim(ResolvedSpec(Elastic(3, 1, "0s")));
  const std::vector<std::string> g1 = ShrunkToOneInWindow2(sim);
  const v1::BeginWindowRequest ahead = sim.BeginRequest(0, 3, 10);  // sent during window 2
  auto held = sim.Begin(ahead);
  ASSERT_TRUE(held.ok()) << held.status();
  EXPECT_FALSE(held->ready);
  sim.Start(2);  // two workers come back while window 2 is in flight
  const size_t before = sim.records().size();
  auto c = sim.Complete(0, 2, RankReport{});
  ASSERT_TRUE(c.ok() && c->ready) << c.status();
  EXPECT_EQ(c->response.decision().outcome(), v1::COMMIT);
  // The generation ended at the boundary: the held call, polled again, is ABORTED.
  EXPECT_EQ(CodeOf(sim.Begin(ahead)), absl::StatusCode::kAborted);
  ASSERT_TRUE(sim.HeartbeatAs(g1[0], 2, /*idle_after=*/sim.generation()).ok());
  const std::vector<v1::GenerationFormed> formed = FormedWith(sim, before, 3);
  ASSERT_EQ(formed.size(), 1u);
  EXPECT_EQ(formed[0].worker_ids(0), g1[0]);
  EXPECT_EQ(formed[0].assignment().next_window_id(), 3);
  EXPECT_EQ(sim.RunWindow().record().world_size(), 3);
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

// ---------------------------------------------------------------------------------------
// The next window's begin report riding on CompleteWindow (`next`): one call per window

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

// A generation whose only state holder dies before it seeded the newcomer: the newcomer holds
// nothing, so the next generation rolls back to the checkpoint instead of broadcasting from
// it. Catches: seeding a generation from a replica that never received the state (seen with
// real processes when two leases expired a millisecond apart).
TEST(StepMachineTest, NewcomerThatNeverSyncedDoesNotSeedTheNextGeneration) {
  SimulatedRanks sim(ResolvedSpec(WithCheckpoints(2, Fp16(1024, 3))));
  const std::vector<std::string> g1 = sim.Start(2);
  sim.RunWindow();
  const v1::WindowDecision d2 = sim.RunWindow();
  ASSERT_TRUE(d2.write_checkpoint());
  ASSERT_TRUE(sim.Ack(d2.checkpoint_id(), 2).ok());
  sim.RunWindow();  // update 3
  auto heartbeat = [&](const std::string& id, int64_t applied) {
    v1::HeartbeatRequest req;
    req.set_job_id(sim.job().job_id());
    req.set_worker_id(id);
    *req.mutable_dataset() = sim.dataset();
    req.set_applied_update_id(applied);
    ASSERT_TRUE(sim.machine().Heartbeat(req, sim.now()).ok());
    sim.Drain();
  };
  const std::string c = sim.AddWorker();
  heartbeat(c, 0);  // a fresh replica: initial weights only
  sim.Advance(absl::Seconds(6));
  heartbeat(g1[1], 3);
  heartbeat(c, 0);
  sim.Advance(absl::Seconds(5));
  sim.Tick();  // g1[0] lost: generation 2 = {g1[1] (holds update 3), c}
  ASSERT_EQ(sim.generation(), 2);
  EXPECT_EQ(sim.Ranks(), (std::vector<std::string>{g1[1], c}));

  const std::string d = sim.AddWorker();
  heartbeat(d, 0);
  sim.Advance(absl::Seconds(6));
  heartbeat(c, 0);
  heartbeat(d, 0);
  sim.Advance(absl::Seconds(5));
  const size_t before = sim.records().size();
  sim.Tick();  // g1[1] lost before anyone reported a window of generation 2
  // c may still be receiving the state (its broadcast fails only now): no rollback yet.
  EXPECT_TRUE(sim.FormedSince(before).empty());
  ASSERT_TRUE(sim.HeartbeatAs(c, 0, /*idle_after=*/2).ok());  // it gave generation 2 up
  const v1::GenerationFormed* f = nullptr;
  for (size_t i = before; i < sim.records().size(); ++i) {
    if (sim.records()[i].has_generation_formed()) f = &sim.records()[i].generation_formed();
  }
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->generation(), 3);
  EXPECT_EQ(f->assignment().state_source(), v1::Assignment::CHECKPOINT);
  EXPECT_TRUE(f->rolled_back());
  EXPECT_EQ(f->assignment().optimizer_update_id(), 2);
}

// Catches: a rollback with no durable checkpoint that keeps the lost ids instead of
// restarting from the initial weights (INIT) with every id at 0.
TEST(StepMachineTest, AllLostWithoutDurableCheckpointRestartsFromInit) {
  SimulatedRanks sim(ResolvedSpec(Fp16(1024, 1)));
  const std::vector<std::string> g1 = sim.Start(2);
  sim.RunWindow();
  sim.RunWindow();
  ASSERT_EQ(sim.progress().loss_scale(), 4096);
  sim.Lose(g1);
  const size_t before = sim.records().size();
  sim.Start(2);
  const v1::GenerationFormed* f = nullptr;
  for (size_t i = before; i < sim.records().size(); ++i) {
    if (sim.records()[i].has_generation_formed()) f = &sim.records()[i].generation_formed();
  }
  ASSERT_NE(f, nullptr);
  EXPECT_TRUE(f->rolled_back());
  EXPECT_EQ(f->assignment().state_source(), v1::Assignment::INIT);
  EXPECT_EQ(f->assignment().next_window_id(), 1);
  EXPECT_EQ(f->assignment().optimizer_update_id(), 0);
  const v1::JobProgress p = sim.progress();
  EXPECT_EQ(p.window_id(), 0);
  EXPECT_EQ(p.optimizer_update_id(), 0);
  EXPECT_EQ(p.scheduler_step(), 0);
  EXPECT_EQ(p.cumulative_tokens(), 0);
  EXPECT_EQ(p.checkpoint_id(), 0);
  EXPECT_EQ(p.loss_scale(), 1024);
  EXPECT_EQ(sim.RunWindow().record().window_id(), 1);
}

// Catches: a fresh job whose workers all die before any update being "rolled back" (or
// losing checkpoint 0's pending write).
TEST(StepMachineTest, AllLostBeforeAnyUpdateStartsFresh) {
  SimulatedRanks sim(ResolvedSpec(WithCheckpoints(10)));
  const std::vector<std::string> g1 = sim.Start(2);
  sim.Lose(g1);
  const std::vector<std::string> g2 = sim.Start(2);
  auto hb = sim.Heartbeat(g2[0]);
  ASSERT_TRUE(hb.ok());
  ASSERT_TRUE(hb->assigned());
  EXPECT_EQ(hb->assignment().generation(), 2);
  EXPECT_EQ(hb->assignment().state_source(), v1::Assignment::INIT);
  ASSERT_TRUE(hb->assignment().has_pending_checkpoint_id());
  EXPECT_EQ(hb->assignment().pending_checkpoint_id(), 0);
  EXPECT_FALSE(sim.machine().Snapshot().generation().rolled_back());
}

// ---------------------------------------------------------------------------------------
// Checkpoints

// Catches: checkpoint 0 not requested from rank 0 before window 1, or requested from
// every rank (all would write the same directory).
TEST(StepMachineTest, CheckpointZeroPendingForRankZeroOnly) {
  SimulatedRanks sim(ResolvedSpec(WithCheckpoints(10)));
  const std::vector<std::string> ids = sim.Start(2);
  auto hb0 = sim.Heartbeat(ids[0]);
  auto hb1 = sim.Heartbeat(ids[1]);
  ASSERT_TRUE(hb0.ok() && hb1.ok());
  ASSERT_TRUE(hb0->assignment().has_pending_checkpoint_id());
  EXPECT_EQ(hb0->assignment().pending_checkpoint_id(), 0);
  EXPECT_FALSE(hb1->assignment().has_pending_checkpoint_id());
  EXPECT_EQ(sim.progress().durable_checkpoint_id(), -1);
  ASSERT_TRUE(sim.Ack(0, 0).ok());
  EXPECT_EQ(sim.progress().durable_checkpoint_id(), 0);
}

// Catches: an ack that is not idempotent, journals twice, or accepts a checkpoint of the
// wrong update, an unknown checkpoint, or a job without checkpoints.
TEST(StepMachineTest, AckCheckpoint) {
  SimulatedRanks sim(ResolvedSpec(WithCheckpoints(1)));
  sim.Start(2);
  const v1::WindowDecision d = sim.RunWindow();
  ASSERT_TRUE(d.write_checkpoint());
  ASSERT_EQ(d.checkpoint_id(), 1);
  EXPECT_EQ(CodeOf(sim.Ack(1, 2)), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CodeOf(sim.Ack(7, 1)), absl::StatusCode::kNotFound);
  EXPECT_EQ(CodeOf(sim.Ack(1, 1, "w-999")), absl::StatusCode::kNotFound);
  EXPECT_EQ(sim.progress().durable_checkpoint_id(), -1);
  const size_t before = sim.records().size();
  ASSERT_TRUE(sim.Ack(1, 1).ok());
  EXPECT_EQ(sim.records().size(), before + 1);
  ASSERT_TRUE(sim.records().back().has_checkpoint_durable());
  EXPECT_EQ(sim.records().back().checkpoint_durable().path(), "/ckpt/ckpt-1");
  EXPECT_EQ(sim.progress().durable_checkpoint_id(), 1);
  ASSERT_TRUE(sim.Ack(1, 1).ok());
  EXPECT_EQ(sim.records().size(), before + 1);  // idempotent

  SimulatedRanks off(ResolvedSpec({}));
  off.Start(2);
  off.RunWindow();
  EXPECT_EQ(CodeOf(off.Ack(0, 0)), absl::StatusCode::kFailedPrecondition);
}

// ---------------------------------------------------------------------------------------
// Stop conditions

// Catches: a job that ends before its final checkpoint is durable, or never ends.
TEST(StepMachineTest, MaxUpdatesEndsAfterFinalCheckpointAck) {
  SimulatedRanks sim(ResolvedSpec([] {
    SpecOptions o = WithCheckpoints(100);
    o.max_updates = 2;
    return o;
  }()));
  sim.Start(2);
  EXPECT_FALSE(sim.RunWindow().job_done());
  const v1::WindowDecision last = sim.RunWindow();
  EXPECT_TRUE(last.job_done());
  ASSERT_TRUE(last.write_checkpoint());  // the final update is always checkpointed
  EXPECT_EQ(last.checkpoint_id(), 1);
  EXPECT_EQ(sim.state(), v1::RUNNING);
  EXPECT_EQ(CodeOf(sim.Begin(0, 3, 10)), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(sim.Ack(1, 2).ok());
  EXPECT_EQ(sim.state(), v1::SUCCEEDED);
  EXPECT_EQ(sim.job().end_time_ms(), absl::ToUnixMillis(sim.now()));
  EXPECT_EQ(sim.progress().max_updates(), 2);
  EXPECT_FALSE(sim.machine().NextDeadline().has_value());
}

// Catches: a job without checkpoints that waits for an ack that never comes.
TEST(StepMachineTest, MaxUpdatesWithoutCheckpointsEndsAtOnce) {
  SpecOptions o;
  o.max_updates = 2;
  SimulatedRanks sim(ResolvedSpec(o));
  sim.Start(2);
  RankReport inf;
  inf.found_inf = true;
  sim.RunWindow();
  EXPECT_EQ(sim.RunWindow(Reports(2, inf)).reason(), "OVERFLOW");  // skips do not count
  EXPECT_EQ(sim.state(), v1::RUNNING);
  const v1::WindowDecision last = sim.RunWindow();
  EXPECT_TRUE(last.job_done());
  EXPECT_FALSE(last.write_checkpoint());
  EXPECT_EQ(sim.state(), v1::SUCCEEDED);
  EXPECT_EQ(sim.progress().optimizer_update_id(), 2);
  EXPECT_EQ(sim.progress().window_id(), 3);
}

// Catches: stop.epochs counted in updates instead of windows, or a wrong epoch index.
TEST(StepMachineTest, EpochsEndTheJob) {
  SpecOptions o;
  o.epochs = 2;
  SimulatedRanks sim(ResolvedSpec(o));
  sim.set_samples(10);  // 3 windows an epoch (tail dynamic)
  sim.Start(2);
  std::vector<int64_t> epochs;
  RankReport inf;
  inf.found_inf = true;
  for (int i = 0; i < 6; ++i) {
    ASSERT_EQ(sim.state(), v1::RUNNING) << i;
    const v1::WindowDecision d = sim.RunWindow(i == 2 ? Reports(2, inf) : Reports(2));
    epochs.push_back(d.record().epoch());
    EXPECT_EQ(d.job_done(), i == 5);
  }
  EXPECT_THAT(epochs, ElementsAre(0, 0, 0, 1, 1, 1));
  EXPECT_EQ(sim.state(), v1::SUCCEEDED);
  EXPECT_EQ(sim.progress().window_id(), 6);
  EXPECT_EQ(sim.progress().optimizer_update_id(), 5);
}

// Catches: a job whose last window is a skip ending without a checkpoint of its last
// commit (the final weights would be lost).
TEST(StepMachineTest, FinalCheckpointAssignedWhenLastWindowSkips) {
  SpecOptions o = WithCheckpoints(100);
  o.epochs = 1;
  SimulatedRanks sim(ResolvedSpec(o));
  sim.set_samples(12);  // 3 windows
  sim.Start(2);
  sim.RunWindow();
  sim.RunWindow();
  RankReport inf;
  inf.found_inf = true;
  const v1::WindowDecision last = sim.RunWindow(Reports(2, inf));
  EXPECT_EQ(last.outcome(), v1::SKIP);
  EXPECT_TRUE(last.job_done());
  ASSERT_TRUE(last.write_checkpoint());
  EXPECT_EQ(last.checkpoint_id(), 1);
  EXPECT_EQ(sim.state(), v1::RUNNING);
  EXPECT_EQ(CodeOf(sim.Ack(1, 1)), absl::StatusCode::kInvalidArgument);  // it holds update 2
  ASSERT_TRUE(sim.Ack(1, 2).ok());
  EXPECT_EQ(sim.state(), v1::SUCCEEDED);
}

// Catches: a second, redundant final checkpoint when the last commit was already
// checkpointed, or a job that ends before that checkpoint is durable.
TEST(StepMachineTest, NoExtraFinalCheckpointWhenLastCommitWasCheckpointed) {
  SpecOptions o = WithCheckpoints(2);
  o.epochs = 1;
  SimulatedRanks sim(ResolvedSpec(o));
  sim.set_samples(12);
  sim.Start(2);
  sim.RunWindow();
  ASSERT_TRUE(sim.RunWindow().write_checkpoint());
  RankReport inf;
  inf.found_inf = true;
  const v1::WindowDecision last = sim.RunWindow(Reports(2, inf));
  EXPECT_TRUE(last.job_done());
  EXPECT_FALSE(last.write_checkpoint());
  EXPECT_EQ(sim.state(), v1::RUNNING);  // checkpoint 1 is not durable yet
  ASSERT_TRUE(sim.Ack(1, 2).ok());
  EXPECT_EQ(sim.state(), v1::SUCCEEDED);
}

// Catches: the final checkpoint forgotten when its writer (rank 0) dies before acking it:
// the next generation's rank 0 must write it, and the job ends only after that ack.
TEST(StepMachineTest, FinalCheckpointReassignedWhenWriterDies) {
  SpecOptions o = WithCheckpoints(100);
  o.max_updates = 1;
  SimulatedRanks sim(ResolvedSpec(o));
  const std::vector<std::string> g1 = sim.Start(2);
  const v1::WindowDecision last = sim.RunWindow();
  ASSERT_TRUE(last.write_checkpoint());
  ASSERT_TRUE(last.job_done());
  sim.Lose({g1[0]});
  EXPECT_EQ(sim.state(), v1::RUNNING);
  const std::string standby = sim.AddWorker();
  ASSERT_TRUE(sim.Heartbeat(standby).ok());
  EXPECT_THAT(sim.Ranks(), ElementsAre(g1[1], standby));
  auto hb0 = sim.Heartbeat(g1[1]);
  auto hb1 = sim.Heartbeat(standby);
  ASSERT_TRUE(hb0.ok() && hb1.ok());
  ASSERT_TRUE(hb0->assigned());
  EXPECT_EQ(hb0->assignment().state_source(), v1::Assignment::BROADCAST);
  ASSERT_TRUE(hb0->assignment().has_pending_checkpoint_id());
  EXPECT_EQ(hb0->assignment().pending_checkpoint_id(), last.checkpoint_id());
  EXPECT_FALSE(hb1->assignment().has_pending_checkpoint_id());
  EXPECT_EQ(sim.state(), v1::RUNNING);
  ASSERT_TRUE(sim.Ack(last.checkpoint_id(), 1, g1[1]).ok());
  EXPECT_EQ(sim.state(), v1::SUCCEEDED);
}

// ---------------------------------------------------------------------------------------
// Cancel, failures, ended jobs

// Catches: cancel that leaves the job running, cancels twice, or lets workers go on.
TEST(StepMachineTest, Cancel) {
  SimulatedRanks sim(ResolvedSpec({}));
  const std::vector<std::string> ids = sim.Start(2);
  sim.BeginAll(1, {10, 10});
  ASSERT_TRUE(sim.machine().Cancel(sim.now()).ok());
  sim.Drain();
  EXPECT_EQ(sim.state(), v1::CANCELLED);
  EXPECT_THAT(sim.job().message(), HasSubstr("cancel"));
  EXPECT_EQ(CodeOf(sim.machine().Cancel(sim.now())), absl::StatusCode::kFailedPrecondition);
  auto c = sim.Complete(0, 1, RankReport{});
  EXPECT_EQ(CodeOf(c), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(MessageOf(c), HasSubstr("CANCELLED"));
  auto hb = sim.Heartbeat(ids[0]);
  ASSERT_TRUE(hb.ok());
  EXPECT_EQ(hb->job_state(), v1::CANCELLED);
  EXPECT_FALSE(hb->assigned());
  EXPECT_FALSE(sim.machine().NextDeadline().has_value());
  sim.Advance(absl::Minutes(5));
  const size_t before = sim.records().size();
  sim.Tick();  // leases of an ended job do not matter
  EXPECT_EQ(sim.records().size(), before);
}

// Catches: a worker's fatal error that does not fail the job, or loses its message.
TEST(StepMachineTest, ReportFailureFailsTheJob) {
  SimulatedRanks sim(ResolvedSpec({}));
  const std::vector<std::string> ids = sim.Start(2);
  v1::ReportFailureRequest req;
  req.set_job_id(sim.job_id());
  req.set_worker_id(ids[1]);
  req.set_message("cannot read /data/x.txt: permission denied");
  ASSERT_TRUE(sim.machine().ReportFailure(req, sim.now()).ok());
  sim.Drain();
  EXPECT_EQ(sim.state(), v1::FAILED);
  EXPECT_THAT(sim.job().message(), HasSubstr("cannot read /data/x.txt: permission denied"));
  EXPECT_THAT(sim.job().message(), HasSubstr(ids[1]));
  EXPECT_THAT(sim.job().message(), HasSubstr("host-2"));
  // A second report does not overwrite the first message.
  req.set_message("other");
  ASSERT_TRUE(sim.machine().ReportFailure(req, sim.now()).ok());
  EXPECT_THAT(sim.job().message(), HasSubstr("permission denied"));
}

// Catches: an ended job that still accepts reports or registrations, or that no longer
// answers a repeated report of its last window.
TEST(StepMachineTest, ReportsAfterTheJobEnded) {
  SpecOptions o;
  o.max_updates = 1;
  SimulatedRanks sim(ResolvedSpec(o));
  sim.Start(2);
  const v1::WindowDecision last = sim.RunWindow();
  ASSERT_EQ(sim.state(), v1::SUCCEEDED);
  auto c = sim.Complete(0, 1, RankReport{});
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(c->ready);
  EXPECT_EQ(c->response.decision().SerializeAsString(), last.SerializeAsString());
  EXPECT_EQ(CodeOf(sim.Begin(0, 2, 10)), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(CodeOf(sim.Complete(0, 2, RankReport{})), absl::StatusCode::kFailedPrecondition);
  v1::RegisterWorkerRequest reg;
  reg.set_job_id(sim.job_id());
  EXPECT_EQ(CodeOf(sim.registry().RegisterWorker(reg, sim.now())),
            absl::StatusCode::kFailedPrecondition);
}

// ---------------------------------------------------------------------------------------
// The worked numbers of docs/numerics.md that belong to the coordinator

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

// Straggler scores: each decided window's phase reports score the ranks; a rank reporting
// three times the compute time of the others scores 1/3 relative, in Workers() and in the
// job's progress by rank, and the scores stay after the job ended. Catches scores computed
// against the wrong rank, lost between the report and the query, or not filled in.
TEST(StepMachineTest, PhaseReportsScoreEachRank) {
  SpecOptions o;
  o.workers = 3;
  o.max_updates = 4;
  SimulatedRanks sim(ResolvedSpec(o));
  sim.Start(3);
  EXPECT_TRUE(sim.job().progress().rank_scores().empty());  // nothing scored yet
  for (int w = 0; w < 4; ++w) {
    std::vector<RankReport> reports = Reports(3);
    for (RankReport& r : reports) r.compute_seconds = 0.1;
    reports[2].compute_seconds = 0.3;
    EXPECT_EQ(sim.RunWindow(reports).outcome(), v1::COMMIT);
  }
  const v1::Job job = sim.job();
  EXPECT_EQ(job.state(), v1::SUCCEEDED);
  ASSERT_EQ(job.progress().rank_scores_size(), 3);
  for (int rank = 0; rank < 3; ++rank) {
    const v1::RankScore& score = job.progress().rank_scores(rank);
    EXPECT_EQ(score.rank(), rank);
    EXPECT_EQ(score.worker_id(), sim.Ranks().at(rank));
    EXPECT_EQ(score.windows(), 4);
    EXPECT_NEAR(score.relative(), rank == 2 ? 1.0 / 3.0 : 1.0, 1e-9) << rank;
    EXPECT_NEAR(score.phases().compute_seconds(), rank == 2 ? 0.3 : 0.1, 1e-9) << rank;
  }
  int scored = 0;
  for (const v1::WorkerInfo& w : sim.machine().Workers()) {
    if (!w.has_score()) continue;
    ++scored;
    EXPECT_NEAR(w.score().relative(), w.worker_id() == sim.Ranks().at(2) ? 1.0 / 3.0 : 1.0, 1e-9);
  }
  EXPECT_EQ(scored, 3);
}

// Reports without phases (an older worker) leave the job unscored rather than scoring zeros.
TEST(StepMachineTest, ReportsWithoutPhasesAreNotScored) {
  SimulatedRanks sim(ResolvedSpec({}));
  sim.Start(2);
  EXPECT_EQ(sim.RunWindow().outcome(), v1::COMMIT);
  EXPECT_TRUE(sim.job().progress().rank_scores().empty());
  for (const v1::WorkerInfo& w : sim.machine().Workers()) EXPECT_FALSE(w.has_score());
}

// --- stragglers.replace_below: a slow rank drained, a standby in its place ---

// Two ranks, rank 1 three times slower, scored over one window and drained after three below
// 0.5 (a spec for the tests below).
SpecOptions ReplaceSlowRanks() {
  SpecOptions o;
  o.workers = 2;
  o.max_updates = 20;
  o.stragglers = R"({"score_windows":1,"replace_below":0.5,"replace_after_windows":3})";
  return o;
}

std::vector<RankReport> RankOneThreeTimesSlower() {
  std::vector<RankReport> reports = Reports(2);
  reports[0].compute_seconds = 0.1;
  reports[1].compute_seconds = 0.3;
  return reports;
}

const v1::WorkerInfo* InfoOf(const std::vector<v1::WorkerInfo>& workers, const std::string& id) {
  for (const v1::WorkerInfo& w : workers) {
    if (w.worker_id() == id) return &w;
  }
  return nullptr;
}

// Catches: a straggler drained in the middle of a window (its reports thrown away), before its
// streak is long enough, without a standby (the world would shrink), or replaced by a
// generation that rolls back or re-initialises the weights instead of broadcasting them.
TEST(StepMachineTest, ASlowRankIsDrainedAtAWindowBoundaryAndAStandbyTakesItsRank) {
  SimulatedRanks sim(ResolvedSpec(ReplaceSlowRanks()));
  sim.Start(2);
  const std::string fast = sim.Ranks().at(0), slow = sim.Ranks().at(1);
  for (int w = 0; w < 3; ++w)
    EXPECT_EQ(sim.RunWindow(RankOneThreeTimesSlower()).outcome(), v1::COMMIT);
  // Three windows below 0.5, but nobody to take its place: it stays.
  EXPECT_EQ(sim.job().progress().rank_scores(1).windows_below(), 3);
  EXPECT_EQ(sim.Ranks(), (std::vector<std::string>{fast, slow}));

  const std::string standby = sim.Start(1).at(0);
  const size_t before = sim.records().size();
  const v1::BeginWindowRequest next_of_slow = sim.BeginRequest(1, 5, 10);
  EXPECT_EQ(sim.RunWindow(RankOneThreeTimesSlower()).outcome(), v1::COMMIT);  // update 4
  const std::vector<v1::WorkerInfo> workers = sim.machine().Workers();
  const v1::WorkerInfo* drained = InfoOf(workers, slow);
  ASSERT_NE(drained, nullptr);
  EXPECT_EQ(drained->state(), v1::LOST);
  EXPECT_THAT(drained->drained(), ::testing::HasSubstr("below stragglers.replace_below 0.5 for 4"));
  // Told to exit, not to register again: its heartbeat is answered, with why.
  absl::StatusOr<v1::HeartbeatResponse> told = sim.Heartbeat(slow);
  ASSERT_TRUE(told.ok()) << told.status();
  EXPECT_EQ(told->drained(), drained->drained());
  EXPECT_FALSE(told->assigned());
  EXPECT_EQ(CodeOf(sim.Begin(next_of_slow)), absl::StatusCode::kNotFound);

  // The survivor says it applied update 4: the next generation takes the standby, seeded from
  // the survivor, at the same update.
  ASSERT_TRUE(sim.HeartbeatAs(fast, 4, /*idle_after=*/sim.generation()).ok());
  const std::vector<v1::GenerationFormed> formed = sim.FormedSince(before);
  ASSERT_EQ(formed.size(), 1u);
  EXPECT_THAT(formed[0].worker_ids(), ::testing::ElementsAre(fast, standby));
  EXPECT_EQ(formed[0].assignment().state_source(), v1::Assignment::BROADCAST);
  EXPECT_EQ(formed[0].assignment().optimizer_update_id(), 4);
  EXPECT_EQ(formed[0].assignment().next_window_id(), 5);
  EXPECT_FALSE(formed[0].rolled_back());
  // No window was aborted for it.
  EXPECT_EQ(sim.progress().windows_aborted(), 0);
  EXPECT_EQ(sim.RunWindow().record().world_size(), 2);

  // Journaled: a replayed registry has the same workers (the drained one LOST, with its reason).
  JobRegistry replayed(sim.options());
  for (const v1::JournalRecord& r : sim.records()) ASSERT_TRUE(replayed.Apply(r).ok());
  const std::vector<v1::WorkerInfo> again = (*replayed.Machine(sim.job_id()))->Workers();
  ASSERT_NE(InfoOf(again, slow), nullptr);
  EXPECT_EQ(InfoOf(again, slow)->drained(), drained->drained());
  EXPECT_EQ(InfoOf(again, standby)->state(), v1::ACTIVE);
}

// Catches: a rank drained for a slow stretch it recovered from (the streak must be unbroken),
// and a drain without the policy.
TEST(StepMachineTest, ARankThatRecoversOrAJobWithoutThePolicyIsNotDrained) {
  for (const bool policy : {true, false}) {
    SpecOptions o = ReplaceSlowRanks();
    if (!policy) o.stragglers = "";
    SimulatedRanks sim(ResolvedSpec(o));
    sim.Start(3);  // a standby from the start
    ASSERT_EQ(sim.Ranks().size(), 2u);
    const std::vector<std::string> ranks = sim.Ranks();
    for (int w = 0; w < 8; ++w) {
      std::vector<RankReport> reports = RankOneThreeTimesSlower();
      if (policy && w % 3 == 2) reports[1].compute_seconds = 0.1;  // never three in a row
      EXPECT_EQ(sim.RunWindow(reports).outcome(), v1::COMMIT);
    }
    EXPECT_EQ(sim.Ranks(), ranks) << (policy ? "recovering rank" : "no policy");
  }
}

// --- spec.validate: a suspicious window re-run, its fault attributed ---

SpecOptions Validated(const std::string& validate, int workers = 2) {
  SpecOptions o;
  o.workers = workers;
  o.max_updates = 20;
  o.validate = validate;
  return o;
}

// Two ranks' reports with local gradient checksums 100 + rank.
std::vector<RankReport> Checksummed(int world = 2) {
  std::vector<RankReport> reports = Reports(world);
  for (int rank = 0; rank < world; ++rank) reports[rank].grad_checksum = 100 + rank;
  return reports;
}

// Catches: a NaN loss skipped without asking who computed it, the faulty rank's first run
// kept, a healthy rank blamed, or the suspect not counted (in Workers, progress and replay).
TEST(StepMachineTest, ANonFiniteLossIsRerunAndATransientFaultIsAttributedToItsRank) {
  SimulatedRanks sim(ResolvedSpec(Validated(R"({"rerun_on":["nonfinite"],"max_suspect":5})")));
  sim.Start(2);
  const std::vector<std::string> ranks = sim.Ranks();
  sim.BeginAll(1, {10, 10});
  std::vector<RankReport> first = Checksummed();
  first[1].loss_sum = std::numeric_limits<double>::quiet_NaN();  // a flipped loss on rank 1
  const v1::WindowDecision d = sim.CompleteWithRerun(1, first, Checksummed());
  EXPECT_EQ(d.outcome(), v1::COMMIT) << "decided on the first run, not the re-run";
  ASSERT_TRUE(d.record().has_rerun());
  const v1::Rerun& rerun = d.record().rerun();
  EXPECT_EQ(rerun.cause(), "nonfinite");
  EXPECT_EQ(rerun.verdict(), "transient");
  EXPECT_EQ(rerun.rank(), 1);
  EXPECT_EQ(rerun.worker_id(), ranks[1]);
  EXPECT_THAT(rerun.ranks(), ::testing::ElementsAre(1));
  EXPECT_DOUBLE_EQ(d.record().loss(), 1.0);  // the re-run's losses: 20 / 20
  EXPECT_EQ(sim.progress().optimizer_update_id(), 1);
  EXPECT_EQ(sim.progress().reruns(), 1);
  EXPECT_EQ(sim.progress().reruns_transient(), 1);
  for (const v1::WorkerInfo& w : sim.machine().Workers()) {
    EXPECT_EQ(w.suspect_count(), w.worker_id() == ranks[1] ? 1 : 0) << w.worker_id();
  }
  JobRegistry replayed(sim.options());
  for (const v1::JournalRecord& r : sim.records()) ASSERT_TRUE(replayed.Apply(r).ok());
  for (const v1::WorkerInfo& w : (*replayed.Machine(sim.job_id()))->Workers()) {
    EXPECT_EQ(w.suspect_count(), w.worker_id() == ranks[1] ? 1 : 0) << "replayed";
  }
  // A gradient that differs between runs (same loss) is a fault too.
  sim.BeginAll(2, {10, 10});
  first = Checksummed();
  first[0].found_inf = first[1].found_inf = true;  // +inf in rank 0's local gradient, summed
  first[0].grad_checksum = 7;
  const v1::WindowDecision d2 = sim.CompleteWithRerun(2, first, Checksummed());
  EXPECT_EQ(d2.outcome(), v1::COMMIT);
  EXPECT_EQ(d2.record().rerun().verdict(), "transient");
  EXPECT_EQ(d2.record().rerun().rank(), 0);
}

// Catches: a reproducible bad window blamed on a rank (it is the data), decided otherwise
// than without validate, or not naming the samples whose loss is non-finite.
TEST(StepMachineTest, AReproducedNonFiniteLossIsSkippedAndNamesItsSamples) {
  SimulatedRanks sim(ResolvedSpec(Validated(R"({"rerun_on":["nonfinite"]})")));
  sim.Start(2);
  sim.BeginAll(1, {10, 10});
  std::vector<RankReport> bad = Checksummed();
  bad[1].loss_sum = std::numeric_limits<double>::infinity();
  std::vector<RankReport> again = bad;
  again[1].sample_losses = {{17, std::numeric_limits<double>::infinity()}, {3, 0.5}};
  again[0].sample_losses = {{4, 0.9}};
  const v1::WindowDecision d = sim.CompleteWithRerun(1, bad, again);
  EXPECT_EQ(d.outcome(), v1::SKIP);
  EXPECT_EQ(d.reason_code(), v1::WINDOW_REASON_NONFINITE_LOSS);
  const v1::Rerun& rerun = d.record().rerun();
  EXPECT_EQ(rerun.verdict(), "persistent");
  EXPECT_EQ(rerun.rank(), 1);
  EXPECT_THAT(rerun.sample_ids(), ::testing::ElementsAre(17));
  EXPECT_EQ(sim.progress().optimizer_update_id(), 0);
  for (const v1::WorkerInfo& w : sim.machine().Workers()) EXPECT_EQ(w.suspect_count(), 0);
  EXPECT_EQ(sim.progress().reruns_transient(), 0);
}

// Catches: a spike test before there is a history to measure it against, a spike not re-run,
// and skip_spikes ignored for a reproducible one.
TEST(StepMachineTest, AReproducedSpikeIsCommittedOrSkippedAsTheSpecSays) {
  for (const bool skip : {false, true}) {
    SimulatedRanks sim(ResolvedSpec(Validated(
        absl::StrCat(R"({"rerun_on":["spike"],"spike_window":3,"spike_sigma":2,"skip_spikes":)",
                     skip ? "true" : "false", "}"))));
    sim.Start(2);
    // A spike in the first window: no history, no re-run.
    std::vector<RankReport> high = Checksummed();
    high[0].loss_sum = high[1].loss_sum = 50.0;
    EXPECT_EQ(sim.RunWindow(high).outcome(), v1::COMMIT);
    for (int w = 0; w < 3; ++w) {
      std::vector<RankReport> r = Checksummed();
      r[0].loss_sum = r[1].loss_sum = 10.0 + w;  // losses 1.0, 1.1, 1.2
      EXPECT_EQ(sim.RunWindow(r).outcome(), v1::COMMIT);
    }
    const int64_t window = sim.next_window();
    sim.BeginAll(window, {10, 10});
    high[1].loss_sum = 60.0;  // rank 1's share dominates the window
    high[1].sample_losses = {{42, 400.0}, {8, 300.0}, {9, 10.0}};
    const v1::WindowDecision d = sim.CompleteWithRerun(window, high, high);
    EXPECT_EQ(d.record().rerun().cause(), "spike");
    EXPECT_EQ(d.record().rerun().verdict(), "persistent");
    EXPECT_THAT(d.record().rerun().sample_ids(), ::testing::ElementsAre(42, 8));
    EXPECT_EQ(d.outcome(), skip ? v1::SKIP : v1::COMMIT);
    if (skip) EXPECT_EQ(d.reason_code(), v1::WINDOW_REASON_LOSS_SPIKE);
  }
}

// Catches: σ computed as E[x²] − mean² (noise for close losses) or with no floor, so that
// losses equal to their last digits make a rise in those digits a "spike": every such window
// re-run, and skipped as LOSS_SPIKE under skip_spikes. A real rise is still one.
TEST(StepMachineTest, ALossRiseInItsLastDigitsIsNoSpike) {
  SimulatedRanks sim(ResolvedSpec(
      Validated(R"({"rerun_on":["spike"],"spike_window":3,"spike_sigma":6,"skip_spikes":true})")));
  sim.Start(2);
  for (int w = 0; w < 3; ++w) {
    std::vector<RankReport> r = Checksummed();
    r[0].loss_sum = r[1].loss_sum = 0.1 * 10.0 * 11.0;  // loss 1.1 each window, to rounding
    ASSERT_EQ(sim.RunWindow(r).outcome(), v1::COMMIT);
  }
  std::vector<RankReport> close = Checksummed();
  close[0].loss_sum = close[1].loss_sum = 11.0 * (1.0 + 1e-9);
  const v1::WindowDecision d = sim.RunWindow(close);
  EXPECT_EQ(d.outcome(), v1::COMMIT);
  EXPECT_FALSE(d.record().has_rerun()) << d.record().rerun().ShortDebugString();

  const int64_t window = sim.next_window();
  sim.BeginAll(window, {10, 10});
  std::vector<RankReport> risen = Checksummed();
  risen[0].loss_sum = risen[1].loss_sum = 11.0 * 1.01;  // 1 % up from constant losses
  const v1::WindowDecision spike = sim.CompleteWithRerun(window, risen, risen);
  EXPECT_EQ(spike.record().rerun().cause(), "spike");
  EXPECT_EQ(spike.outcome(), v1::SKIP);
}

// Catches: a worker faulty max_suspect times kept training, or drained mid-window.
TEST(StepMachineTest, AWorkerFaultyMaxSuspectTimesIsDrainedForAStandby) {
  SimulatedRanks sim(ResolvedSpec(Validated(R"({"rerun_on":["nonfinite"],"max_suspect":2})")));
  sim.Start(3);  // two ranks and a standby
  const std::vector<std::string> ranks = sim.Ranks();
  for (int64_t window = 1; window <= 2; ++window) {
    sim.BeginAll(window, {10, 10});
    std::vector<RankReport> first = Checksummed();
    first[1].loss_sum = std::numeric_limits<double>::quiet_NaN();
    EXPECT_EQ(sim.CompleteWithRerun(window, first, Checksummed()).outcome(), v1::COMMIT);
    if (window == 1) EXPECT_EQ(sim.Ranks(), ranks) << "drained after one fault of two";
  }
  const std::vector<v1::WorkerInfo> workers = sim.machine().Workers();
  const v1::WorkerInfo* drained = InfoOf(workers, ranks[1]);
  ASSERT_NE(drained, nullptr);
  EXPECT_EQ(drained->state(), v1::LOST);
  EXPECT_THAT(drained->drained(), ::testing::HasSubstr("faulty: a re-run found"));
  ASSERT_TRUE(sim.HeartbeatAs(ranks[0], 2, /*idle_after=*/sim.generation()).ok());
  ASSERT_EQ(sim.Ranks().size(), 2u);
  EXPECT_EQ(sim.Ranks()[0], ranks[0]);
  EXPECT_NE(sim.Ranks()[1], ranks[1]);
}

// Catches: a re-run report reaching a coordinator that never asked for it (it restarted and
// lost the first run's reports) decided as if it were a first run; and, when the restarted
// coordinator heard nothing else of the window (ranks stop re-sending their begin reports
// once their all-reduce ran), answered "aborted: rejoin" with nothing aborted: no record, the
// generation left live, the ranks stuck until their heartbeats ended it.
TEST(StepMachineTest, AReRunNobodyAskedForAbortsTheWindow) {
  for (const bool begun : {true, false}) {
    SCOPED_TRACE(begun ? "begin reports seen" : "nothing seen of the window");
    SimulatedRanks sim(ResolvedSpec(Validated(R"({"rerun_on":["nonfinite"]})")));
    sim.Start(2);
    if (begun) {
      sim.BeginAll(1, {10, 10});
    } else {
      sim.registry().Restore(sim.registry().Snapshot(), sim.now());
      sim.registry().Recovered(sim.now());
    }
    // Both ranks' re-run reports get the same answer: the window aborted, both rejoin.
    const int64_t generation = sim.generation();
    for (int rank = 0; rank < 2; ++rank) {
      RankReport second = Checksummed()[rank];
      second.run = 2;
      v1::CompleteWindowRequest req = sim.CompleteRequest(rank, 1, second);
      req.set_generation(generation);  // the ranks' own, whether or not the next one formed
      auto a = sim.Complete(req);
      ASSERT_TRUE(a.ok()) << a.status();
      ASSERT_TRUE(a->ready);
      EXPECT_EQ(a->response.decision().outcome(), v1::ABORT);
      EXPECT_EQ(a->response.decision().reason_code(), v1::WINDOW_REASON_RERUN_INTERRUPTED);
    }
    EXPECT_EQ(sim.progress().windows_aborted(), 1) << "the abort was not recorded";
  }
}

}  // namespace
}  // namespace trainstep
