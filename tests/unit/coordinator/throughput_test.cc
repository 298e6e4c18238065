#include "coordinator/throughput.h"

#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

namespace trainstep {
namespace {

const absl::Time kStart = absl::FromUnixSeconds(1'800'000'000);

v1::Job RunningJob() {
  v1::Job job;
  job.set_state(v1::RUNNING);
  job.set_start_time_ms(absl::ToUnixMillis(kStart));
  return job;
}

v1::UpdateRecord Record(absl::Duration at, const std::string& outcome, int64_t tokens) {
  v1::UpdateRecord r;
  r.set_outcome(outcome);
  r.set_global_valid_tokens(tokens);
  r.set_end_time_ms(absl::ToUnixMillis(kStart + at));
  return r;
}

// Catches a rate over the whole history instead of the last minute: the old commits at 10 s
// and 20 s must not count at 100 s.
TEST(ThroughputTest, CountsOnlyCommitsOfTheLastMinute) {
  v1::Job job = RunningJob();
  std::vector<v1::UpdateRecord> log = {
      Record(absl::Seconds(10), "commit", 1000), Record(absl::Seconds(20), "commit", 1000),
      Record(absl::Seconds(40), "commit", 600),  // at 100 − 60 s: just outside
      Record(absl::Seconds(70), "commit", 600),  Record(absl::Seconds(80), "skip", 600),
      Record(absl::Seconds(90), "abort", 600),   Record(absl::Seconds(95), "commit", 600)};
  v1::Throughput t = ComputeThroughput(log, job, kStart + absl::Seconds(100));
  EXPECT_DOUBLE_EQ(t.span_seconds(), 60);
  EXPECT_DOUBLE_EQ(t.tokens_per_second(), 1200.0 / 60);  // skips and aborts train nothing
  EXPECT_DOUBLE_EQ(t.updates_per_second(), 2.0 / 60);
  EXPECT_DOUBLE_EQ(t.windows_per_second(), 3.0 / 60);  // a skip ends a window, an abort does not
}

// Catches dividing a young job's tokens by a full minute (a 10 s old job would read 6× slow).
TEST(ThroughputTest, AYoungJobIsMeasuredOverItsAge) {
  v1::Job job = RunningJob();
  std::vector<v1::UpdateRecord> log = {Record(absl::Seconds(5), "commit", 500),
                                       Record(absl::Seconds(10), "commit", 500)};
  v1::Throughput t = ComputeThroughput(log, job, kStart + absl::Seconds(10));
  EXPECT_DOUBLE_EQ(t.span_seconds(), 10);
  EXPECT_DOUBLE_EQ(t.tokens_per_second(), 100);
  EXPECT_DOUBLE_EQ(t.updates_per_second(), 0.2);
}

// Catches a stalled job keeping its old rate: a minute without commits reads 0 and no ETA.
TEST(ThroughputTest, AStalledJobReadsZeroWithoutEta) {
  v1::Job job = RunningJob();
  job.mutable_spec()->mutable_stop()->set_max_updates(100);
  std::vector<v1::UpdateRecord> log = {Record(absl::Seconds(200), "commit", 500)};
  v1::Throughput t = ComputeThroughput(log, job, kStart + absl::Seconds(300));
  EXPECT_EQ(t.tokens_per_second(), 0);
  EXPECT_EQ(t.updates_per_second(), 0);
  EXPECT_FALSE(t.has_eta_seconds());
}

// Catches an ETA from the wrong counter: 40 updates left at 2 updates/s is 20 s.
TEST(ThroughputTest, EtaFromMaxUpdates) {
  v1::Job job = RunningJob();
  job.mutable_spec()->mutable_stop()->set_max_updates(100);
  job.mutable_progress()->set_optimizer_update_id(60);
  std::vector<v1::UpdateRecord> log;
  for (int i = 1; i <= 120; ++i) log.push_back(Record(absl::Milliseconds(500 * i), "commit", 10));
  v1::Throughput t = ComputeThroughput(log, job, kStart + absl::Seconds(60));
  EXPECT_DOUBLE_EQ(t.updates_per_second(), 2);
  ASSERT_TRUE(t.has_eta_seconds());
  EXPECT_DOUBLE_EQ(t.eta_seconds(), 20);
}

// Catches an epoch-bounded ETA counting updates: skipped windows advance the epochs too.
TEST(ThroughputTest, EtaFromEpochsCountsWindows) {
  v1::Job job = RunningJob();
  job.mutable_spec()->mutable_stop()->set_epochs(2);
  job.mutable_progress()->set_windows_per_epoch(15);
  job.mutable_progress()->set_window_id(10);
  std::vector<v1::UpdateRecord> log;
  for (int i = 1; i <= 10; ++i) {
    log.push_back(Record(absl::Seconds(i), i % 2 == 0 ? "skip" : "commit", 10));
  }
  v1::Throughput t = ComputeThroughput(log, job, kStart + absl::Seconds(10));
  EXPECT_DOUBLE_EQ(t.windows_per_second(), 1);
  ASSERT_TRUE(t.has_eta_seconds());
  EXPECT_DOUBLE_EQ(t.eta_seconds(), 20);  // 30 windows in all, 10 done, 1 a second
}

// Catches a window total that overflows on a huge stop.epochs: no ETA rather than a wrapped one.
TEST(ThroughputTest, NoEtaForEpochsBeyondAnyHorizon) {
  v1::Job job = RunningJob();
  job.mutable_spec()->mutable_stop()->set_epochs(std::numeric_limits<int64_t>::max());
  job.mutable_progress()->set_windows_per_epoch(15);
  job.mutable_progress()->set_window_id(10);
  std::vector<v1::UpdateRecord> log;
  for (int i = 1; i <= 10; ++i) log.push_back(Record(absl::Seconds(i), "commit", 10));
  v1::Throughput t = ComputeThroughput(log, job, kStart + absl::Seconds(10));
  EXPECT_DOUBLE_EQ(t.windows_per_second(), 1);
  EXPECT_FALSE(t.has_eta_seconds());
}

// Catches an ended job decaying to 0 as time passes: it is measured over its last minute.
TEST(ThroughputTest, AnEndedJobIsMeasuredAtItsEnd) {
  v1::Job job = RunningJob();
  job.set_state(v1::SUCCEEDED);
  job.set_end_time_ms(absl::ToUnixMillis(kStart + absl::Seconds(120)));
  job.mutable_spec()->mutable_stop()->set_max_updates(2);
  job.mutable_progress()->set_optimizer_update_id(2);
  std::vector<v1::UpdateRecord> log = {Record(absl::Seconds(90), "commit", 300),
                                       Record(absl::Seconds(120), "commit", 300)};
  v1::Throughput t = ComputeThroughput(log, job, kStart + absl::Hours(5));
  EXPECT_DOUBLE_EQ(t.tokens_per_second(), 10);
  EXPECT_FALSE(t.has_eta_seconds());  // nothing is left to estimate
}

// Catches dividing by a zero or negative span (a job not started, a clock behind the start).
TEST(ThroughputTest, NotStartedReadsZero) {
  v1::Job pending;
  pending.set_state(v1::PENDING);
  EXPECT_EQ(ComputeThroughput({}, pending, kStart).span_seconds(), 0);
  v1::Job job = RunningJob();
  v1::Throughput t = ComputeThroughput({Record(absl::ZeroDuration(), "commit", 5)}, job,
                                       kStart - absl::Seconds(1));
  EXPECT_EQ(t.span_seconds(), 0);
  EXPECT_EQ(t.tokens_per_second(), 0);
}

}  // namespace
}  // namespace trainstep
