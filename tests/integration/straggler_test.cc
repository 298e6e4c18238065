// Straggler scores through real processes (issue 26, part 2): a worker slowed three times
// (--debug-slow-factor, fault injection) is named by its scores in ListWorkers, GetJob and the
// coordinator's trainstep_rank_score, and the others score as the fastest.
#include <gtest/gtest.h>

#include <chrono>
#include <iostream>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/integration/cluster_test.h"
#include "tests/integration/process_cluster.h"
#include "tests/observability/observability_util.h"

namespace trainstep {
namespace {

class StragglerTest : public testing::ClusterTest {
 protected:
  StragglerTest() : ClusterTest("trainstep-straggler-") {}
};

// An MLP large enough that a micro-step takes milliseconds, so the slowed rank's sleep is
// many timer ticks long and the 3× shows in the scores, not the scheduler's slack.
constexpr char kSpec[] =
    R"({"seed":5,"model":{"mlp":{"hidden":512}},)"
    R"("data":{"synthetic_regression":{"samples":4096,"in_features":256}},)"
    R"("batch":{"micro_batch_size":32,"accumulation_steps":2},"workers":{"count":2},)"
    R"("optimizer":{"sgd":{"lr":0.001}},"stop":{"max_updates":40},)"
    R"("stragglers":{"score_windows":10}})";

// Catches: scores attributed to the wrong worker, inverted (slow / fast), not smoothed per
// unit, or missing from any of the three places a user looks.
TEST_F(StragglerTest, ARankSlowedThreeTimesScoresAThird) {
  absl::StatusOr<std::string> id = cluster_->Submit(kSpec);
  ASSERT_TRUE(id.ok()) << id.status();
  ASSERT_TRUE(cluster_->StartWorker(*id, {"--name=fast"}).ok());
  ASSERT_TRUE(cluster_->StartWorker(*id, {"--name=slow", "--debug_slow_factor=3"}).ok());
  absl::StatusOr<v1::Job> job = cluster_->WaitForJob(*id, absl::Seconds(240));
  ASSERT_TRUE(job.ok()) << job.status() << cluster_->Logs();
  ASSERT_EQ(job->state(), v1::SUCCEEDED) << job->message() << cluster_->Logs();

  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::ListWorkersRequest req;
  req.set_job_id(*id);
  v1::ListWorkersResponse workers;
  ASSERT_TRUE(cluster_->jobs()->ListWorkers(&ctx, req, &workers).ok());
  std::string slow_id;
  for (const v1::WorkerInfo& w : workers.workers()) {
    std::cout << w.name() << ": " << w.score().ShortDebugString() << "\n";  // for the record
    ASSERT_TRUE(w.has_score()) << w.ShortDebugString();
    EXPECT_GE(w.score().windows(), 30) << w.ShortDebugString();
    if (w.name() == "slow") {
      slow_id = w.worker_id();
      EXPECT_GT(w.score().relative(), 0.22) << w.ShortDebugString();
      EXPECT_LT(w.score().relative(), 0.45) << w.ShortDebugString();
    } else {
      EXPECT_EQ(w.score().relative(), 1.0) << w.ShortDebugString();
    }
    // Its own best over 10-window averages: noisy on a shared machine, but a ratio.
    EXPECT_GT(w.score().individual(), 0.0) << w.ShortDebugString();
    EXPECT_LE(w.score().individual(), 1.0) << w.ShortDebugString();
    EXPECT_GT(w.score().phases().compute_seconds(), 0.0) << w.ShortDebugString();
  }
  ASSERT_FALSE(slow_id.empty());

  // GetJob, by rank, and the coordinator's metric: the lowest score is the slow rank's.
  ASSERT_EQ(job->progress().rank_scores_size(), 2);
  double lowest = 1.0;
  for (const v1::RankScore& s : job->progress().rank_scores()) {
    if (s.worker_id() == slow_id) lowest = s.relative();
  }
  EXPECT_LT(lowest, 0.45);
  absl::StatusOr<std::string> text = obs::HttpGet(cluster_->metrics_port(), "/metrics");
  ASSERT_TRUE(text.ok()) << text.status();
  std::smatch m;
  const std::regex line(absl::StrCat(R"(trainstep_rank_score\{kind="relative",training_job=")", *id,
                                     R"("\} ([0-9.e+-]+))"));
  ASSERT_TRUE(std::regex_search(*text, m, line)) << *text;
  EXPECT_DOUBLE_EQ(std::stod(m[1].str()), lowest);
}

}  // namespace
}  // namespace trainstep
