// StepMachine tests: A worker's own calls: registration, dataset reports
// (coordinator/step_machine/worker_calls.cc).
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "coordinator/step_machine.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/coordinator/step_machine/step_machine_test_util.h"

namespace trainstep {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing_util::CodeOf;
using testing_util::MessageOf;
using testing_util::ResolvedSpec;
using testing_util::SimulatedRanks;
using testing_util::SpecOptions;

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

}  // namespace
}  // namespace trainstep
