// What users read: durations, rates, tables and the progress lines of `job watch`.
#include "client/format.h"

#include <gtest/gtest.h>

#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "client/commands.h"
#include "client/progress.h"

namespace trainstep::client {
namespace {

// Catches: a state name that differs from the proto's, or an unset or unknown state printed as
// the proto's "JOB_STATE_UNSPECIFIED" or as nothing.
TEST(FormatTest, JobStateName) {
  EXPECT_EQ(JobStateName(v1::PENDING), "PENDING");
  EXPECT_EQ(JobStateName(v1::RUNNING), "RUNNING");
  EXPECT_EQ(JobStateName(v1::SUCCEEDED), "SUCCEEDED");
  EXPECT_EQ(JobStateName(v1::FAILED), "FAILED");
  EXPECT_EQ(JobStateName(v1::CANCELLED), "CANCELLED");
  EXPECT_EQ(JobStateName(v1::JOB_STATE_UNSPECIFIED), "UNKNOWN");
  EXPECT_EQ(JobStateName(static_cast<v1::JobState>(99)), "UNKNOWN");
}

// Catches: `worker list` showing a re-registered worker's old row as a bare LOST, without the
// id that replaced it, or an unknown state printed as nothing.
TEST(FormatTest, WorkerStateText) {
  v1::WorkerInfo w;
  w.set_state(v1::ACTIVE);
  EXPECT_EQ(WorkerStateText(w), "ACTIVE");
  w.set_state(v1::LOST);
  EXPECT_EQ(WorkerStateText(w), "LOST");
  w.set_replaced_by("w-7");
  EXPECT_EQ(WorkerStateText(w), "LOST (replaced by w-7)");
  w.clear_replaced_by();
  w.set_drained("straggler: relative score 0.3 below stragglers.replace_below 0.5");
  EXPECT_EQ(WorkerStateText(w), "LOST (drained: straggler)");  // it exits: nothing replaces it
  w.set_drained("faulty: a re-run found its first run not reproduced in 2 windows");
  EXPECT_EQ(WorkerStateText(w), "LOST (drained: faulty)");
  w.clear_drained();
  w.set_state(static_cast<v1::WorkerState>(99));
  EXPECT_EQ(WorkerStateText(w), "UNKNOWN");
}

// Catches: a straggler's scores shown swapped, unrounded, or as zeros before any was scored.
TEST(FormatTest, ScoreCellAndRankScoreText) {
  v1::WorkerInfo w;
  EXPECT_EQ(ScoreCell(w), "-");
  w.mutable_score()->set_relative(1.0 / 3.0);
  w.mutable_score()->set_individual(0.981);
  EXPECT_EQ(ScoreCell(w), "0.33/0.98");

  v1::RankScore s = w.score();
  s.set_worker_id("w-2");
  s.set_windows(20);
  s.mutable_phases()->set_compute_seconds(1.234);
  s.mutable_phases()->set_data_seconds(0.002);
  s.mutable_phases()->set_allreduce_seconds(0.01);
  s.mutable_phases()->set_coordinator_seconds(0.001);
  EXPECT_EQ(RankScoreText(s),
            "w-2: relative 0.33, individual 0.98 (20 windows); per window compute 1.234s, data "
            "2ms, all-reduce 10ms, waiting on the coordinator 1ms");
  s.set_windows_below(7);  // a replacement streak is shown
  EXPECT_EQ(RankScoreText(s),
            "w-2: relative 0.33, individual 0.98 (20 windows, 7 in a row below "
            "stragglers.replace_below); per window compute 1.234s, data 2ms, all-reduce 10ms, "
            "waiting on the coordinator 1ms");
}

// Catches: raw seconds ("80s"), zero-padded or sign-carrying durations.
TEST(FormatTest, ShortDuration) {
  EXPECT_EQ(ShortDuration(absl::ZeroDuration()), "0s");
  EXPECT_EQ(ShortDuration(absl::Seconds(-5)), "0s");
  EXPECT_EQ(ShortDuration(absl::Milliseconds(500)), "500ms");
  EXPECT_EQ(ShortDuration(absl::Seconds(42)), "42s");
  EXPECT_EQ(ShortDuration(absl::Seconds(80)), "1m20s");
  EXPECT_EQ(ShortDuration(absl::Seconds(120)), "2m");
  EXPECT_EQ(ShortDuration(absl::Seconds(80.9)), "1m20s");
  EXPECT_EQ(ShortDuration(absl::Hours(3) + absl::Minutes(5) + absl::Seconds(9)), "3h5m");
  EXPECT_EQ(ShortDuration(absl::Hours(52)), "2d4h");
  EXPECT_EQ(ShortDuration(absl::Hours(48)), "2d");
}

// Catches: "1000k" instead of "1.0M", long fractions, and "0.0" for a count of zero.
TEST(FormatTest, SiRates) {
  EXPECT_EQ(FormatSi(0), "0");
  EXPECT_EQ(FormatSi(7), "7");
  EXPECT_EQ(FormatSi(3.14), "3.1");
  EXPECT_EQ(FormatSi(950), "950");
  EXPECT_EQ(FormatSi(3140), "3.1k");
  EXPECT_EQ(FormatSi(12500), "12.5k");
  EXPECT_EQ(FormatSi(125000), "125k");
  EXPECT_EQ(FormatSi(99999), "100k");
  EXPECT_EQ(FormatSi(999.96), "1.0k");
  EXPECT_EQ(FormatSi(999960), "1.0M");
  EXPECT_EQ(FormatSi(1.26e6), "1.3M");
  EXPECT_EQ(FormatSi(4.2e9), "4.2G");
  EXPECT_EQ(FormatSi(-3140), "-3.1k");
  EXPECT_EQ(FormatSi(std::numeric_limits<double>::quiet_NaN()), "-");
}

TEST(FormatTest, Numbers) {
  EXPECT_EQ(FormatLoss(2.31416), "2.314");
  EXPECT_EQ(FormatLossScale(65536), "65536");
  EXPECT_EQ(FormatLossScale(0.5), "0.5");
  EXPECT_EQ(FormatLearningRate(8e-4), "8.0e-04");
}

ProgressView SampleView() {
  ProgressView v;
  v.done = 120;
  v.total = 200;
  v.units_per_second = 3140;
  v.loss = 2.3141;
  v.loss_scale = 65536;
  v.learning_rate = 8e-4;
  v.skipped = 2;
  v.eta = absl::Seconds(80);
  return v;
}

// Catches: a drifting layout of the live line (bar width, field order, spacing).
TEST(FormatTest, ProgressLineWithMax) {
  EXPECT_EQ(ProgressLine(SampleView()),
            "update 120/200 [#######.....] 3.1k tok/s  loss 2.314  scale 65536  lr 8.0e-04  "
            "skipped 2  ETA 1m20s");
}

// Catches: a bar or an ETA invented when the total is unknown.
TEST(FormatTest, ProgressLineWithoutMax) {
  ProgressView v = SampleView();
  v.total = 0;
  EXPECT_EQ(ProgressLine(v),
            "update 120  3.1k tok/s  loss 2.314  scale 65536  lr 8.0e-04  skipped 2");
  v.units_per_second.reset();
  v.loss.reset();
  v.unit = "samples";
  EXPECT_EQ(ProgressLine(v), "update 120  loss -  scale 65536  lr 8.0e-04  skipped 2");
}

// Catches a job short of workers that looks merely slow on the live line.
TEST(FormatTest, ProgressLineSaysWhatAJobWaitsFor) {
  ProgressView v = SampleView();
  v.waiting = "waiting for workers: 1 available, workers.min is 2 (workers.count 3)";
  EXPECT_EQ(ProgressLine(v),
            "update 120/200 [#######.....] 3.1k tok/s  loss 2.314  scale 65536  lr 8.0e-04  "
            "skipped 2  ETA 1m20s  (waiting for workers: 1 available, workers.min is 2 "
            "(workers.count 3))");
}

TEST(FormatTest, ProgressBar) {
  EXPECT_EQ(ProgressBar(0, 200), "[............]");
  EXPECT_EQ(ProgressBar(200, 200), "[############]");
  EXPECT_EQ(ProgressBar(500, 200), "[############]");  // clamped
  EXPECT_EQ(ProgressBar(1, 4, 4), "[#...]");
}

// Catches: the plain per-update line losing a field or its reason.
TEST(FormatTest, UpdateLine) {
  v1::UpdateRecord r;
  r.set_window_id(12);
  r.set_outcome("commit");
  r.set_optimizer_update_id(12);
  r.set_loss(2.31414);
  r.set_learning_rate(0.0008);
  r.set_loss_scale(65536);
  r.set_grad_norm_pre_clip(1.234);
  r.set_grad_norm_post_clip(1.0);
  r.set_global_valid_tokens(4096);
  r.set_micro_step_id(96);
  r.set_update_interval_seconds(1.25);
  EXPECT_EQ(UpdateLine(r),
            "window 12 commit update=12 loss=2.3141 lr=0.0008 scale=65536 norm=1.23->1.00 "
            "tokens=4096 micro_step=96 interval=1.250s");
  r.set_outcome("skip");
  r.set_reason("OVERFLOW");
  r.clear_update_interval_seconds();
  r.set_tail_window(true);
  r.mutable_dropped_tail()->set_samples(4);
  EXPECT_EQ(UpdateLine(r).rfind("window 12 skip OVERFLOW update=12 ", 0), 0u) << UpdateLine(r);
  EXPECT_TRUE(absl::EndsWith(UpdateLine(r), "micro_step=96 tail dropped=4")) << UpdateLine(r);
  // An evaluated update ends with its held-out loss.
  r.set_outcome("commit");
  r.set_reason("");
  r.set_tail_window(false);
  r.clear_dropped_tail();
  r.set_eval_loss(2.5);
  EXPECT_EQ(UpdateLine(r),
            "window 12 commit update=12 loss=2.3141 lr=0.0008 scale=65536 norm=1.23->1.00 "
            "tokens=4096 micro_step=96 eval_loss=2.5");
}

// Catches: a dropped tail shown without its epoch, count or positions, or a listing that
// grows with the tail.
TEST(FormatTest, DroppedTailText) {
  v1::DroppedTail d;
  d.set_epoch(1);
  d.set_samples(4);
  d.set_first_position(40);
  EXPECT_EQ(DroppedTailText(d), "epoch 1: 4 samples, positions 40-43");
  for (int64_t id : {int64_t{17}, int64_t{3}, int64_t{41}, int64_t{8}}) d.add_sample_ids(id);
  EXPECT_EQ(DroppedTailText(d), "epoch 1: 4 samples, positions 40-43, ids 17 3 41 8");
  d.set_samples(12);
  for (int64_t id = 100; id < 108; ++id) d.add_sample_ids(id);
  EXPECT_EQ(DroppedTailText(d),
            "epoch 1: 12 samples, positions 40-51, ids 17 3 41 8 100 101 102 103 … (4 more)");
}

std::string StripAnsi(std::string s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\033') {
      while (i < s.size() && s[i] != 'm') ++i;
      continue;
    }
    out.push_back(s[i]);
  }
  return out;
}

// Display column of every cell start, per line.
std::vector<size_t> ColumnStarts(const std::string& line) {
  std::vector<size_t> starts;
  size_t col = 0;
  bool in_gap = true;
  for (size_t i = 0; i < line.size(); ++i) {
    const unsigned char c = line[i];
    if ((c & 0xC0) == 0x80) continue;  // UTF-8 continuation: no column
    // Cells are separated by 3+ spaces; single spaces inside a cell do not start one.
    const bool gap = line.compare(i, 3, "   ") == 0 || (in_gap && c == ' ');
    if (!gap && in_gap) starts.push_back(col);
    in_gap = gap;
    ++col;
  }
  return starts;
}

// Catches: misaligned columns (wide cells, multi-byte text, colour codes counted as width)
// and trailing spaces.
TEST(FormatTest, TableAlignment) {
  const std::vector<std::vector<Cell>> rows = {
      {"job-1", "a", Cell("RUNNING", Color::kCyan), "120/200"},
      {"job-10000", "a-much-longer-name", Cell("FAILED", Color::kRed), "-"},
      {"job-3", "≥ñ", "PENDING", "0"},
  };
  const std::vector<std::string> header = {"ID", "NAME", "STATE", "UPDATES/MAX"};
  const std::string plain = RenderTable(header, rows, /*color=*/false);
  const std::string colored = RenderTable(header, rows, /*color=*/true);
  EXPECT_EQ(plain.find('\033'), std::string::npos);
  EXPECT_NE(colored.find("\033[31mFAILED"), std::string::npos);
  EXPECT_EQ(StripAnsi(colored), plain);

  const std::vector<std::string> lines = absl::StrSplit(plain, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 4u);
  const std::vector<size_t> want = ColumnStarts(lines[0]);
  ASSERT_EQ(want.size(), 4u) << lines[0];
  EXPECT_EQ(want, (std::vector<size_t>{0, 12, 33, 43}));
  for (const std::string& l : lines) {
    EXPECT_EQ(ColumnStarts(l), want) << l;
    EXPECT_NE(l.back(), ' ') << l;
  }
}

TEST(FormatTest, KeyValuesAligned) {
  EXPECT_EQ(RenderKeyValues({{"id", "job-1"}, {"learning rate", "1.0e-03"}, {"message", ""}}),
            "id:            job-1\n"
            "learning rate: 1.0e-03\n"
            "message:\n");
}

v1::Job JobAt(int64_t updates, int64_t windows, int64_t tokens) {
  v1::Job job;
  job.set_job_id("job-1");
  job.set_state(v1::RUNNING);
  job.mutable_spec()->mutable_data()->mutable_synthetic_regression()->set_samples(1000);
  v1::JobProgress* p = job.mutable_progress();
  p->set_optimizer_update_id(updates);
  p->set_window_id(windows);
  p->set_cumulative_tokens(tokens);
  p->set_max_updates(100);
  p->set_last_loss(1.5);
  p->set_loss_scale(1024);
  p->set_learning_rate(1e-3);
  return job;
}

// Catches: the replayed history counted as throughput, and an ETA from the wrong rate.
TEST(ProgressTrackerTest, RatesCountOnlyWhatHappensWhileWatching) {
  const absl::Time t0 = absl::FromUnixSeconds(1'700'000'000);
  ProgressTracker tracker;
  EXPECT_FALSE(tracker.has_job());
  tracker.OnJob(JobAt(10, 10, 1000), t0);
  for (int w = 1; w <= 10; ++w) {  // the history, replayed at once
    v1::UpdateRecord r;
    r.set_window_id(w);
    r.set_outcome("commit");
    r.set_optimizer_update_id(w);
    r.set_cumulative_tokens(100 * w);
    tracker.OnUpdate(r, t0);
  }
  ProgressView v = tracker.View(t0);
  EXPECT_FALSE(v.units_per_second.has_value());  // nothing happened yet
  EXPECT_FALSE(v.eta.has_value());
  EXPECT_EQ(v.done, 10);
  EXPECT_EQ(v.total, 100);

  tracker.OnJob(JobAt(40, 40, 4000), t0 + absl::Seconds(10));
  v = tracker.View(t0 + absl::Seconds(10));
  ASSERT_TRUE(v.units_per_second.has_value());
  EXPECT_DOUBLE_EQ(*v.units_per_second, 300);  // 3000 samples over 10 s
  ASSERT_TRUE(v.eta.has_value());
  EXPECT_EQ(*v.eta, absl::Seconds(20));  // 60 updates left at 3 per second
  EXPECT_EQ(v.label, "update");
  EXPECT_EQ(v.unit, "samples");
  EXPECT_EQ(*v.loss, 1.5);

  // A record newer than the last Job event moves the line on.
  v1::UpdateRecord r;
  r.set_window_id(41);
  r.set_outcome("commit");
  r.set_optimizer_update_id(41);
  r.set_cumulative_tokens(4100);
  r.set_loss(1.25);
  r.set_loss_scale(2048);
  tracker.OnUpdate(r, t0 + absl::Seconds(10));
  v = tracker.View(t0 + absl::Seconds(10));
  EXPECT_EQ(v.done, 41);
  EXPECT_EQ(*v.loss, 1.25);
  EXPECT_EQ(v.loss_scale, 2048);
}

// Catches: an epoch-bound job shown without its total, or with updates against a window total.
TEST(ProgressTrackerTest, EpochBoundJobCountsWindows) {
  const absl::Time t0 = absl::FromUnixSeconds(1'700'000'000);
  v1::Job job = JobAt(8, 10, 0);
  job.mutable_progress()->set_max_updates(0);
  job.mutable_progress()->set_windows_per_epoch(50);
  job.mutable_spec()->mutable_stop()->set_epochs(2);
  job.mutable_spec()->mutable_data()->mutable_text()->add_paths("x.txt");
  ProgressTracker tracker;
  tracker.OnJob(job, t0);
  const ProgressView v = tracker.View(t0);
  EXPECT_EQ(v.label, "window");
  EXPECT_EQ(v.done, 10);
  EXPECT_EQ(v.total, 100);
  EXPECT_EQ(v.unit, "tok");
  EXPECT_EQ(MaxUpdates(job), 100);
  // A huge stop.epochs saturates instead of overflowing.
  job.mutable_spec()->mutable_stop()->set_epochs(std::numeric_limits<int64_t>::max() / 2);
  EXPECT_EQ(MaxUpdates(job), std::numeric_limits<int64_t>::max());
  job.mutable_progress()->set_windows_per_epoch(0);
  EXPECT_EQ(MaxUpdates(job), 0);  // dataset not reported yet
}

// Catches: the watch line ignoring the coordinator's last-minute throughput (it would show the
// rate since watching began), and the held-out loss missing from the line.
TEST(ProgressTrackerTest, UsesTheCoordinatorsThroughputAndShowsTheEvalLoss) {
  const absl::Time t0 = absl::FromUnixSeconds(1'700'000'000);
  v1::Job job = JobAt(40, 40, 4000);
  v1::Throughput* t = job.mutable_throughput();
  t->set_span_seconds(60);
  t->set_tokens_per_second(3100);
  t->set_updates_per_second(2.5);
  t->set_eta_seconds(24);
  job.mutable_progress()->set_last_eval_loss(2.5);
  job.mutable_progress()->set_last_eval_update_id(40);
  ProgressTracker tracker;
  tracker.OnJob(job, t0);
  ProgressView v = tracker.View(t0);  // at once: no local rate could exist yet
  ASSERT_TRUE(v.units_per_second.has_value());
  EXPECT_EQ(*v.units_per_second, 3100);
  EXPECT_EQ(*v.updates_per_second, 2.5);
  EXPECT_EQ(*v.eta, absl::Seconds(24));
  EXPECT_EQ(*v.eval_loss, 2.5);
  const std::string line = ProgressLine(v);
  EXPECT_NE(line.find("] 3.1k samples/s  2.5 upd/s  loss 1.5  eval 2.5  scale 1024"),
            std::string::npos)
      << line;
  EXPECT_EQ(line.substr(line.size() - 7), "ETA 24s") << line;
  // An evaluated record newer than the job event updates the eval loss.
  v1::UpdateRecord r;
  r.set_window_id(41);
  r.set_outcome("commit");
  r.set_optimizer_update_id(41);
  r.set_eval_loss(2.25);
  tracker.OnUpdate(r, t0);
  EXPECT_EQ(*tracker.View(t0).eval_loss, 2.25);
}

// Catches: `job get` without its throughput line, or one with the wrong unit or no ETA.
TEST(FormatTest, ThroughputText) {
  v1::Job job;
  EXPECT_EQ(ThroughputText(job), "-");
  job.mutable_spec()->mutable_data()->mutable_text()->add_paths("x.txt");
  v1::Throughput* t = job.mutable_throughput();
  t->set_span_seconds(60);
  t->set_tokens_per_second(12500);
  t->set_updates_per_second(2);
  EXPECT_EQ(ThroughputText(job), "12.5k tok/s, 2 updates/s (last 1m)");
  t->set_eta_seconds(80);
  EXPECT_EQ(ThroughputText(job), "12.5k tok/s, 2 updates/s (last 1m), ETA 1m20s");
}

// Catches: a request id that changes between two quick submits (double submit creates two
// jobs) or never changes (the same spec can never be submitted again).
TEST(RequestIdTest, SameBytesSameMinute) {
  const absl::Time t = absl::FromUnixSeconds(1'700'000'020);  // 40 s into a minute
  EXPECT_EQ(DefaultRequestId("{}", t), DefaultRequestId("{}", t + absl::Seconds(19)));
  EXPECT_NE(DefaultRequestId("{}", t), DefaultRequestId("{}", t + absl::Seconds(20)));
  EXPECT_NE(DefaultRequestId("{}", t), DefaultRequestId("{ }", t));
}

TEST(ExitCodeTest, OfJob) {
  v1::Job job;
  job.set_state(v1::SUCCEEDED);
  EXPECT_EQ(ExitCodeOfJob(job), kExitOk);
  job.set_state(v1::FAILED);
  EXPECT_EQ(ExitCodeOfJob(job), kExitJobFailed);
  job.set_state(v1::CANCELLED);
  EXPECT_EQ(ExitCodeOfJob(job), kExitJobCancelled);
  job.set_state(v1::RUNNING);
  EXPECT_EQ(ExitCodeOfJob(job), kExitError);
}

}  // namespace
}  // namespace trainstep::client
