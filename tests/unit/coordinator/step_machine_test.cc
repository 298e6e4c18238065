// StepMachine tests: The job's end by cancel or failure, and reports after it
// (coordinator/step_machine.cc).
#include "coordinator/step_machine.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/coordinator/step_machine/step_machine_test_util.h"

namespace trainstep {
namespace {

using ::testing::HasSubstr;
using testing_util::CodeOf;
using testing_util::MessageOf;
using testing_util::RankReport;
using testing_util::ResolvedSpec;
using testing_util::SimulatedRanks;
using testing_util::SpecOptions;

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

}  // namespace
}  // namespace trainstep
