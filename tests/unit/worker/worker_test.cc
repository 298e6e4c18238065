// The worker's protocol loop against a fake coordinator in the same process (no sockets, no
// coordinator binary): one rank of a tiny mlp job, with the coordinator's answers scripted per
// test and time injected. What a real coordinator decides is tested elsewhere; here, what the
// worker does with each answer.
#include "worker/worker.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/clock.h"
#include "core/spec.h"

namespace trainstep {
namespace {

constexpr int64_t kUpdates = 3;

// `extra`: more top-level spec fields (JSON, with a leading comma).
v1::JobSpec TinyJob(const std::string& extra = "") {
  absl::StatusOr<v1::JobSpec> spec = ParseAndResolveJobSpec(absl::StrCat(
      R"({"seed":3,"model":{"mlp":{"hidden":4}},)",
      R"("data":{"synthetic_regression":{"samples":16,"in_features":2}},)",
      R"("batch":{"micro_batch_size":2,"accumulation_steps":2},)",
      R"("optimizer":{"sgd":{"lr":0.1}},"stop":{"max_updates":)", kUpdates, "}", extra, "}"));
  EXPECT_TRUE(spec.ok()) << spec.status();
  return spec.ok() ? *spec : v1::JobSpec();
}

// One job, one rank: registration, heartbeats with the rank's place, the two barriers and an
// in-memory rendezvous store. Tests script the decisions: a window's first attempt may be
// aborted, skipped, or refused with an error. As the real coordinator does, a BeginWindow
// riding on a CompleteWindow (pipelined, `next`) is answered with what follows that window's
// decision (loss scale, update id) in the same response, and left unanswered when its
// generation ended (ABORTED) or the job stopped (FAILED_PRECONDITION): the worker then sends
// no such window, or BeginWindow itself. A BeginWindow sent ahead on its own is refused (the
// worker does not send one). events() records the calls in order.
class FakeCoordinator : public WorkerRpc {
 public:
  absl::StatusOr<v1::RegisterWorkerResponse> RegisterWorker(
      const v1::RegisterWorkerRequest&) override {
    v1::RegisterWorkerResponse r;
    r.set_worker_id("w1");
    r.set_job_id("job-1");
    absl::MutexLock lock(&mu_);
    *r.mutable_spec() = spec_;
    r.set_heartbeat_interval_ms(heartbeat_interval_ms_);
    return r;
  }
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest&) override {
    absl::MutexLock lock(&mu_);
    v1::HeartbeatResponse r;
    r.set_job_state(state_);
    r.set_job_message(job_message_);
    r.set_dataset_accepted(true);
    if (state_ == v1::RUNNING) {
      r.set_assigned(true);
      v1::Assignment* a = r.mutable_assignment();
      a->set_generation(generation_);
      a->set_rank(0);
      a->set_world_size(1);
      a->set_store_prefix(absl::StrCat("job-1/g", generation_, "/"));
      a->set_next_window_id(next_window_);
      a->set_state_source(generation_ == 1 ? v1::Assignment::INIT : v1::Assignment::BROADCAST);
      a->set_optimizer_update_id(update_);
      a->set_scheduler_step(update_);
      a->set_loss_scale(1);
    }
    return r;
  }
  absl::Status ReportFailure(const v1::ReportFailureRequest& req) override {
    absl::MutexLock lock(&mu_);
    failures_.push_back(req.message());
    state_ = v1::FAILED;
    return absl::OkStatus();
  }
  absl::StatusOr<v1::BeginWindowResponse> BeginWindow(const v1::BeginWindowRequest& req) override {
    absl::MutexLock lock(&mu_);
    ++plain_begins_;
    CountBegin(req);
    if (req.generation() == generation_ && req.window_id() > next_window_) {
      return absl::InternalError("a BeginWindow sent ahead on its own (test expects it to ride)");
    }
    return AnswerBegin(req);
  }
  absl::StatusOr<v1::CompleteWindowResponse> CompleteWindow(
      const v1::CompleteWindowRequest& req) override {
    absl::MutexLock lock(&mu_);
    const std::string at = absl::StrCat(req.generation(), ".", req.window_id());
    events_.push_back(absl::StrCat("complete ", at));
    completes_.push_back(req);
    if (req.has_next()) CountBegin(req.next());  // counted before the decision, as sent ahead
    absl::StatusOr<v1::CompleteWindowResponse> answer = Decide(req);
    if (answer.ok() && req.has_next()) {
      absl::StatusOr<v1::BeginWindowResponse> next = AnswerBegin(req.next());
      if (next.ok()) *answer->mutable_next() = *std::move(next);
    }
    events_.push_back(absl::StrCat("return ", at));
    return answer;
  }
  absl::StatusOr<v1::ReportEvalResponse> ReportEval(const v1::ReportEvalRequest&) override {
    return absl::UnimplementedError("no eval in these tests");
  }
  absl::Status AckCheckpoint(const v1::AckCheckpointRequest&) override {
    return absl::UnimplementedError("no checkpoints in these tests");
  }

  absl::Status StoreSet(const StoreScope& scope, const std::string& key,
                        const std::string& value) override {
    absl::MutexLock lock(&mu_);
    store_generations_.insert(scope.generation);
    store_[key] = value;
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> StoreGet(const StoreScope& scope, const std::string& key,
                                       absl::Duration timeout) override {
    absl::MutexLock lock(&mu_);
    store_generations_.insert(scope.generation);
    auto present = [&] { return store_.count(key) > 0; };
    if (!mu_.AwaitWithTimeout(absl::Condition(&present), timeout)) {
      return absl::DeadlineExceededError(key);
    }
    return store_[key];
  }
  absl::StatusOr<int64_t> StoreAdd(const StoreScope& scope, const std::string& key,
                                   int64_t delta) override {
    absl::MutexLock lock(&mu_);
    store_generations_.insert(scope.generation);
    int64_t value = 0;
    if (store_.count(key) > 0) value = std::stoll(store_[key]);
    value += delta;
    store_[key] = std::to_string(value);
    return value;
  }
  absl::StatusOr<std::string> StoreCompareSet(const StoreScope& scope, const std::string& key,
                                              const std::string& expected,
                                              const std::string& desired) override {
    absl::MutexLock lock(&mu_);
    store_generations_.insert(scope.generation);
    auto it = store_.find(key);
    if ((it == store_.end() && expected.empty()) ||
        (it != store_.end() && it->second == expected)) {
      store_[key] = desired;
      return desired;
    }
    return it == store_.end() ? expected : it->second;
  }
  absl::StatusOr<bool> StoreCheck(const StoreScope& scope,
                                  const std::vector<std::string>& keys) override {
    absl::MutexLock lock(&mu_);
    store_generations_.insert(scope.generation);
    for (const std::string& k : keys) {
      if (store_.count(k) == 0) return false;
    }
    return true;
  }
  absl::Status StoreWait(const StoreScope& scope, const std::vector<std::string>& keys,
                         absl::Duration timeout) override {
    for (const std::string& k : keys) {
      absl::StatusOr<std::string> v = StoreGet(scope, k, timeout);
      if (!v.ok()) return v.status();
    }
    return absl::OkStatus();
  }
  absl::StatusOr<bool> StoreDeleteKey(const StoreScope& scope, const std::string& key) override {
    absl::MutexLock lock(&mu_);
    store_generations_.insert(scope.generation);
    return store_.erase(key) > 0;
  }
  absl::StatusOr<int64_t> StoreNumKeys(const StoreScope& scope) override {
    absl::MutexLock lock(&mu_);
    store_generations_.insert(scope.generation);
    return static_cast<int64_t>(store_.size());
  }

  // --- Scripting ---
  void SetSpec(const v1::JobSpec& spec) {
    absl::MutexLock lock(&mu_);
    spec_ = spec;
  }
  void SetLossScale(double scale) {
    absl::MutexLock lock(&mu_);
    loss_scale_ = scale;
  }
  // The job ends after this many updates, whatever the spec says (a stop the worker did not
  // foresee, e.g. the job ended by others).
  void StopAfterUpdates(int64_t updates) {
    absl::MutexLock lock(&mu_);
    stop_after_ = updates;
  }
  // SKIP(OVERFLOW): the loss scale backs off (halves) with the decision.
  void SkipFirstAttemptOf(int64_t window) {
    absl::MutexLock lock(&mu_);
    skip_window_ = window;
  }
  void AbortFirstAttemptOf(int64_t window) {
    absl::MutexLock lock(&mu_);
    abort_window_ = window;
  }
  void RefuseFirstAttemptOf(int64_t window, absl::Status status) {
    absl::MutexLock lock(&mu_);
    refuse_window_ = window;
    refusal_ = std::move(status);
  }
  // The job ends (`state`, `message`) while window `window` is in flight: its CompleteWindow is
  // refused as a real coordinator refuses a report of an ended job.
  void EndJobDuring(int64_t window, v1::JobState state, const std::string& message) {
    absl::MutexLock lock(&mu_);
    end_window_ = window;
    end_state_ = state;
    end_message_ = message;
  }
  // Heartbeats far apart: the worker learns nothing from them during a window unless it asks.
  void SlowHeartbeats() {
    absl::MutexLock lock(&mu_);
    heartbeat_interval_ms_ = 600000;
  }
  void NeverEndTheJob() {
    absl::MutexLock lock(&mu_);
    end_when_done_ = false;
  }

  // BeginWindow calls of their own (not riding on a CompleteWindow).
  int plain_begins() const {
    absl::MutexLock lock(&mu_);
    return plain_begins_;
  }
  // Every begin report, on its own or riding, as (generation, window), in arrival order.
  std::vector<std::pair<int64_t, int64_t>> begins() const {
    absl::MutexLock lock(&mu_);
    return begins_;
  }
  std::vector<v1::CompleteWindowRequest> completes() const {
    absl::MutexLock lock(&mu_);
    return completes_;
  }
  std::vector<std::string> failures() const {
    absl::MutexLock lock(&mu_);
    return failures_;
  }
  // The generations the rendezvous store's calls named.
  std::set<int64_t> store_generations() const {
    absl::MutexLock lock(&mu_);
    return store_generations_;
  }
  // "begin G.W" (arrived), "answer G.W <scale | code>", "complete G.W" (arrived),
  // "decide G.W <outcome>", "return G.W" (CompleteWindow returns), in the order they happened.
  std::vector<std::string> events() const {
    absl::MutexLock lock(&mu_);
    return events_;
  }

 private:
  void CountBegin(const v1::BeginWindowRequest& req) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    events_.push_back(absl::StrCat("begin ", req.generation(), ".", req.window_id()));
    begins_.push_back({req.generation(), req.window_id()});
  }

  absl::StatusOr<v1::BeginWindowResponse> AnswerBegin(const v1::BeginWindowRequest& req)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    absl::StatusOr<v1::BeginWindowResponse> answer;
    if (req.generation() != generation_) {
      answer = absl::AbortedError(absl::StrCat("generation ", req.generation(), " is over"));
    } else if (state_ != v1::RUNNING || update_ >= stop_after_) {
      answer = absl::FailedPreconditionError(
          absl::StrCat("training is done: there is no window ", req.window_id()));
    } else {
      v1::BeginWindowResponse r;
      r.set_global_valid_units(req.valid_units());
      r.set_loss_scale(loss_scale_);  // after every decision before this window
      r.set_learning_rate(0.1);
      r.set_optimizer_update_id(update_);
      answer = r;
    }
    events_.push_back(
        absl::StrCat("answer ", req.generation(), ".", req.window_id(), " ",
                     answer.ok() ? absl::StrCat(answer->loss_scale())
                                 : std::string(absl::StatusCodeToString(answer.status().code()))));
    return answer;
  }

  absl::StatusOr<v1::CompleteWindowResponse> Decide(const v1::CompleteWindowRequest& req)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const std::string at = absl::StrCat(req.generation(), ".", req.window_id());
    if (end_window_ == req.window_id()) {
      end_window_ = 0;
      state_ = end_state_;
      job_message_ = end_message_;
      events_.push_back(absl::StrCat("decide ", at, " ", v1::JobState_Name(state_)));
      return absl::FailedPreconditionError(absl::StrCat("job job-1 is ", v1::JobState_Name(state_),
                                                        ": ", job_message_));  // CheckRunnable's
    }
    if (refuse_window_ == req.window_id()) {
      refuse_window_ = 0;
      if (refusal_.code() == absl::StatusCode::kAborted) {
        ++generation_;  // a stale report: that generation is over
        next_window_ = req.window_id();
      }
      events_.push_back(
          absl::StrCat("decide ", at, " ", absl::StatusCodeToString(refusal_.code())));
      return refusal_;
    }
    v1::CompleteWindowResponse r;
    v1::WindowDecision* d = r.mutable_decision();
    if (abort_window_ == req.window_id()) {
      abort_window_ = 0;
      d->set_outcome(v1::ABORT);
      d->set_reason("WORKER_LOST");
      ++generation_;  // the next generation retries the same window
      next_window_ = req.window_id();
      events_.push_back(absl::StrCat("decide ", at, " ABORT"));
      return r;
    }
    next_window_ = req.window_id() + 1;
    if (skip_window_ == req.window_id()) {
      skip_window_ = 0;
      loss_scale_ /= 2;
      d->set_outcome(v1::SKIP);
      d->set_reason("OVERFLOW");
    } else {
      ++update_;
      d->set_outcome(v1::COMMIT);
      d->set_clip_coef(1);
      d->set_learning_rate(0.1);
    }
    d->set_optimizer_update_id(update_);
    d->set_scheduler_step(update_);
    d->set_job_done(update_ == stop_after_);
    d->mutable_record()->set_loss_scale(loss_scale_);
    if (d->job_done() && end_when_done_) state_ = v1::SUCCEEDED;
    events_.push_back(absl::StrCat("decide ", at, " ", v1::WindowOutcome_Name(d->outcome())));
    return r;
  }

  mutable absl::Mutex mu_;
  v1::JobSpec spec_ ABSL_GUARDED_BY(mu_) = TinyJob();
  double loss_scale_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t stop_after_ ABSL_GUARDED_BY(mu_) = kUpdates;
  int64_t skip_window_ ABSL_GUARDED_BY(mu_) = 0;
  int plain_begins_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::string> events_ ABSL_GUARDED_BY(mu_);
  v1::JobState state_ ABSL_GUARDED_BY(mu_) = v1::RUNNING;
  std::string job_message_ ABSL_GUARDED_BY(mu_);
  int64_t heartbeat_interval_ms_ ABSL_GUARDED_BY(mu_) = 50;
  int64_t end_window_ ABSL_GUARDED_BY(mu_) = 0;
  v1::JobState end_state_ ABSL_GUARDED_BY(mu_) = v1::RUNNING;
  std::string end_message_ ABSL_GUARDED_BY(mu_);
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t next_window_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t update_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t abort_window_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t refuse_window_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status refusal_ ABSL_GUARDED_BY(mu_);
  bool end_when_done_ ABSL_GUARDED_BY(mu_) = true;
  std::map<std::string, std::string> store_ ABSL_GUARDED_BY(mu_);
  std::set<int64_t> store_generations_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<int64_t, int64_t>> begins_ ABSL_GUARDED_BY(mu_);  // (generation, window)
  std::vector<v1::CompleteWindowRequest> completes_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> failures_ ABSL_GUARDED_BY(mu_);
};

class WorkerTest : public ::testing::Test {
 protected:
  WorkerOptions Options() {
    WorkerOptions o;
    o.coordinator = "fake";
    o.name = "worker-test";
    o.client = &coordinator_;
    o.clock = &clock_;
    return o;
  }
  FakeClock clock_;
  FakeCoordinator coordinator_;
};

// Catches a worker that does not run every window to the job's end, or exits non-zero after a
// successful job.
TEST_F(WorkerTest, CommitsEveryWindowAndEndsWithTheJob) {
  Worker worker(Options());
  const WorkerExit exit = worker.Run();
  EXPECT_EQ(exit.code, 0) << exit.message;
  EXPECT_NE(exit.message.find("SUCCEEDED"), std::string::npos) << exit.message;
  // Once each: windows 2 and 3 rode on the previous window's CompleteWindow, and nothing
  // after the last window (whose successor the stop rules out).
  const std::vector<std::pair<int64_t, int64_t>> expected = {{1, 1}, {1, 2}, {1, 3}};
  EXPECT_EQ(coordinator_.begins(), expected);
  // Each update changed the weights: the next window's loss differs.
  const std::vector<v1::CompleteWindowRequest> c = coordinator_.completes();
  ASSERT_EQ(c.size(), 3u);
  EXPECT_NE(c[0].loss_sum(), c[1].loss_sum());
  EXPECT_EQ(c[0].micro_steps(), 2);
  EXPECT_EQ(c[0].allreduce_calls(), 1);
}

// Catches an aborted window leaving anything behind (gradients, an optimizer step) or not being
// retried: the next generation runs the same window again from the same weights.
TEST_F(WorkerTest, AbortedWindowRejoinsAndRetriesItFromTheSameWeights) {
  coordinator_.AbortFirstAttemptOf(2);
  Worker worker(Options());
  const WorkerExit exit = worker.Run();
  EXPECT_EQ(exit.code, 0) << exit.message;
  // (1, 3) rode on window 2's CompleteWindow and was dropped with its generation.
  const std::vector<std::pair<int64_t, int64_t>> expected = {
      {1, 1}, {1, 2}, {1, 3}, {2, 2}, {2, 3}};
  EXPECT_EQ(coordinator_.begins(), expected);
  const std::vector<v1::CompleteWindowRequest> c = coordinator_.completes();
  ASSERT_EQ(c.size(), 4u);
  EXPECT_EQ(c[1].generation(), 1);
  EXPECT_EQ(c[2].generation(), 2);
  EXPECT_DOUBLE_EQ(c[1].loss_sum(), c[2].loss_sum());
  EXPECT_DOUBLE_EQ(c[1].grad_norm(), c[2].grad_norm());  // no residue of the aborted attempt
  // Each generation's rendezvous named its own generation: the coordinator ends a dead one's
  // waits by it.
  EXPECT_EQ(coordinator_.store_generations(), (std::set<int64_t>{1, 2}));
}

// Catches a stale report (ABORTED) read as a failure of the job: the worker rejoins instead.
TEST_F(WorkerTest, StaleReportRejoinsInsteadOfFailing) {
  coordinator_.RefuseFirstAttemptOf(2, absl::AbortedError("generation 1 is over"));
  Worker worker(Options());
  const WorkerExit exit = worker.Run();
  EXPECT_EQ(exit.code, 0) << exit.message;
  EXPECT_TRUE(coordinator_.failures().empty());
  const std::vector<std::pair<int64_t, int64_t>> expected = {
      {1, 1}, {1, 2}, {1, 3}, {2, 2}, {2, 3}};
  EXPECT_EQ(coordinator_.begins(), expected);
}

// Catches an error that cannot heal (a report the coordinator refuses as malformed) being
// retried or swallowed: the job fails with its message and the worker exits 1.
TEST_F(WorkerTest, RefusedReportFailsTheJobWithItsMessage) {
  coordinator_.RefuseFirstAttemptOf(
      2, absl::InvalidArgumentError("CompleteWindowRequest.grad_norm must be ≥ 0, got -1"));
  Worker worker(Options());
  const WorkerExit exit = worker.Run();
  EXPECT_EQ(exit.code, 1);
  ASSERT_EQ(coordinator_.failures().size(), 1u);
  EXPECT_NE(coordinator_.failures()[0].find("grad_norm must be"), std::string::npos)
      << coordinator_.failures()[0];
  // Window 3's begin report rode on the refused CompleteWindow(2): never answered, and never
  // sent again on its own.
  const std::vector<std::string> events = coordinator_.events();
  EXPECT_NE(std::find(events.begin(), events.end(), "begin 1.3"), events.end())
      << absl::StrJoin(events, "\n");
  for (const std::string& e : events) EXPECT_FALSE(absl::StartsWith(e, "answer 1.3")) << e;
  EXPECT_EQ(coordinator_.plain_begins(), 1);
}

// The job is cancelled while window 2 is in flight: its CompleteWindow is refused, and no
// heartbeat has said so yet. Catches that refusal taken as this worker's failure (exit 1, an
// ERROR, a failure reported): Kubernetes would restart the pod and alert.
TEST_F(WorkerTest, CancelledMidWindowExitsZeroSayingSo) {
  coordinator_.SlowHeartbeats();
  coordinator_.EndJobDuring(2, v1::CANCELLED, "cancelled by a client");
  Worker worker(Options());
  const WorkerExit exit = worker.Run();
  EXPECT_EQ(exit.code, 0) << exit.message;
  EXPECT_EQ(exit.message, "job job-1 was cancelled: cancelled by a client");
  EXPECT_TRUE(coordinator_.failures().empty()) << absl::StrJoin(coordinator_.failures(), "\n");
  EXPECT_EQ(coordinator_.completes().size(), 2u);
}

// The same, but the job failed by another worker's error: not this worker's failure (exit 0,
// a restart would only be refused), and the job's reason, not this worker's refused report,
// is what it says. Catches the refusal reported as this worker's own failure.
TEST_F(WorkerTest, JobFailedByAnotherRankMidWindowExitsZeroWithTheJobsReason) {
  coordinator_.SlowHeartbeats();
  coordinator_.EndJobDuring(2, v1::FAILED, "worker w2 on host-b: out of memory");
  Worker worker(Options());
  const WorkerExit exit = worker.Run();
  EXPECT_EQ(exit.code, 0);
  EXPECT_EQ(exit.message, "job job-1 failed: worker w2 on host-b: out of memory");
  EXPECT_TRUE(coordinator_.failures().empty()) << absl::StrJoin(coordinator_.failures(), "\n");
}

// Catches a worker that waits for ever for a job that never ends after its last window (the
// wait runs on the injected clock: half an hour passes in no time).
TEST_F(WorkerTest, GivesUpOnAJobThatNeverEndsAfterItsLastWindow) {
  coordinator_.NeverEndTheJob();
  std::atomic<bool> done{false};
  WorkerExit exit;
  std::thread run([&] {
    Worker worker(Options());
    exit = worker.Run();
    done = true;
  });
  for (int i = 0; i < 20000 && coordinator_.completes().size() < kUpdates; ++i) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_EQ(coordinator_.completes().size(), static_cast<size_t>(kUpdates));
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_FALSE(done);
  clock_.Advance(absl::Minutes(31));
  run.join();
  EXPECT_EQ(exit.code, 1);
  EXPECT_NE(exit.message.find("did not end within"), std::string::npos) << exit.message;
}

// Observations of trainstep_worker_compute_seconds{phase}.
uint64_t PhaseCount(const WorkerMetrics& m, const std::string& phase) {
  for (const prometheus::MetricFamily& f : m.registry()->Collect()) {
    if (f.name != "trainstep_worker_compute_seconds") continue;
    for (const prometheus::ClientMetric& c : f.metric) {
      for (const prometheus::ClientMetric::Label& l : c.label) {
        if (l.name == "phase" && l.value == phase) return c.histogram.sample_count;
      }
    }
  }
  return 0;
}

// The same job with the all-reduce overlapped with the last backward (the default) and after
// it (--overlap-allreduce=false): every report the same bits, one bucket per window either
// way, the overlapped time observed only when overlapping.
// Catches: the worker's hooks reading a gradient before the last micro-step's accumulation,
// the unscale/check/norm taken before the last bucket was summed and copied back, the switch
// that does not switch, a second pass over the gradients.
TEST_F(WorkerTest, OverlappedAllReduceReportsTheSameNumbersAsAfterBackward) {
  std::vector<v1::CompleteWindowRequest> runs[2];
  for (bool overlap : {true, false}) {
    SCOPED_TRACE(overlap ? "overlapped" : "after backward");
    FakeCoordinator coordinator;
    WorkerMetrics metrics;
    WorkerOptions o = Options();
    o.client = &coordinator;
    o.metrics = &metrics;
    o.overlap_allreduce = overlap;
    Worker worker(o);
    const WorkerExit exit = worker.Run();
    ASSERT_EQ(exit.code, 0) << exit.message;
    runs[overlap ? 0 : 1] = coordinator.completes();
    EXPECT_EQ(PhaseCount(metrics, "allreduce"), static_cast<uint64_t>(kUpdates));
    EXPECT_EQ(PhaseCount(metrics, "allreduce_overlapped"),
              static_cast<uint64_t>(overlap ? kUpdates : 0));
  }
  ASSERT_EQ(runs[0].size(), static_cast<size_t>(kUpdates));
  ASSERT_EQ(runs[1].size(), runs[0].size());
  for (size_t w = 0; w < runs[0].size(); ++w) {
    EXPECT_EQ(runs[0][w].loss_sum(), runs[1][w].loss_sum()) << "window " << w + 1;
    EXPECT_EQ(runs[0][w].grad_norm(), runs[1][w].grad_norm()) << "window " << w + 1;
    EXPECT_GT(runs[0][w].grad_norm(), 0.0);
    EXPECT_EQ(runs[0][w].allreduce_calls(), 1);
    EXPECT_EQ(runs[1][w].allreduce_calls(), 1);
  }
}

// Where `event` is in `events`; events.size() if it is not there.
size_t IndexOf(const std::vector<std::string>& events, const std::string& event) {
  return std::find(events.begin(), events.end(), event) - events.begin();
}

// Pipelined BeginWindow (--pipeline-begin, the default): window w+1's begin report rides on
// window w's CompleteWindow, is answered with w's decision in the same response, and that
// answer is what window w+1 runs with: one call per window after the first.
// Catches: a worker that sends BeginWindow(w+1) on its own (two calls per window), one that
// sends it again in RunWindow(w+1) instead of taking the answer, a riding report that differs
// from the window it announces, or one attached to the last window.
TEST_F(WorkerTest, PipelinedBeginRidesOnCompleteWindowAndItsAnswerIsUsed) {
  Worker worker(Options());
  const WorkerExit exit = worker.Run();
  ASSERT_EQ(exit.code, 0) << exit.message;
  const std::vector<std::string> e = coordinator_.events();
  const std::string all = absl::StrJoin(e, "\n");
  for (int w : {1, 2}) {
    const std::string next = absl::StrCat("1.", w + 1);
    const std::string at = absl::StrCat("1.", w);
    // Arrived with CompleteWindow(w), answered after w's decision, before that call returned.
    EXPECT_LT(IndexOf(e, "complete " + at), IndexOf(e, "begin " + next)) << all;
    EXPECT_LT(IndexOf(e, "begin " + next), IndexOf(e, "decide " + at + " COMMIT")) << all;
    EXPECT_LT(IndexOf(e, "decide " + at + " COMMIT"), IndexOf(e, "answer " + next + " 1")) << all;
    EXPECT_LT(IndexOf(e, "answer " + next + " 1"), IndexOf(e, "return " + at)) << all;
    EXPECT_EQ(std::count(e.begin(), e.end(), "begin " + next), 1) << all;
    EXPECT_LT(IndexOf(e, "return " + at), IndexOf(e, "complete " + next)) << all;
  }
  EXPECT_EQ(coordinator_.plain_begins(), 1) << all;  // window 1's only
  const std::vector<v1::CompleteWindowRequest> c = coordinator_.completes();
  ASSERT_EQ(c.size(), static_cast<size_t>(kUpdates));
  for (size_t i = 0; i + 1 < c.size(); ++i) {
    ASSERT_TRUE(c[i].has_next()) << "window " << c[i].window_id();
    EXPECT_EQ(c[i].next().window_id(), c[i].window_id() + 1);
    EXPECT_EQ(c[i].next().generation(), c[i].generation());
    EXPECT_EQ(c[i].next().valid_units(), c[i + 1].valid_units());  // the n_r it announced
  }
  EXPECT_FALSE(c.back().has_next());  // the stop rules a successor out
}

// A SKIP backs the loss scale off; the next window's BeginWindow rode on the skipped window's
// CompleteWindow, and was answered after that decision with the backed-off scale. The scale a
// window ran with shows in its report: with a loss scaler, grad_norm_scaled = S · grad_norm (S a
// power of 2). Catches: window w+1 running with an answer computed before w's decision (the scale
// before the backoff), e.g. w's own answer reused, or a pipelined answer taken too early.
TEST_F(WorkerTest, AfterASkipTheNextWindowRunsWithTheScaleThatFollowedIt) {
  coordinator_.SetSpec(TinyJob(R"(,"loss_scaler":{"enabled":true,"init_scale":1024})"));
  coordinator_.SetLossScale(1024);
  coordinator_.SkipFirstAttemptOf(1);
  Worker worker(Options());
  const WorkerExit exit = worker.Run();
  ASSERT_EQ(exit.code, 0) << exit.message;
  const std::vector<std::string> e = coordinator_.events();
  const std::string all = absl::StrJoin(e, "\n");
  // Window 2's begin report rode on window 1's CompleteWindow, answered once it was skipped.
  EXPECT_LT(IndexOf(e, "begin 1.2"), IndexOf(e, "decide 1.1 SKIP")) << all;
  EXPECT_LT(IndexOf(e, "decide 1.1 SKIP"), IndexOf(e, "answer 1.2 512")) << all;
  EXPECT_EQ(std::count(e.begin(), e.end(), "begin 1.2"), 1) << all;
  const std::vector<v1::CompleteWindowRequest> c = coordinator_.completes();
  ASSERT_EQ(c.size(), 4u);  // one skip, then three commits
  const double scales[] = {1024, 512, 512, 512};
  for (size_t i = 0; i < c.size(); ++i) {
    ASSERT_TRUE(c[i].has_grad_norm_scaled()) << "window " << c[i].window_id();
    ASSERT_GT(c[i].grad_norm(), 0.0);
    EXPECT_NEAR(c[i].grad_norm_scaled() / c[i].grad_norm(), scales[i], scales[i] * 1e-9)
        << "window " << c[i].window_id() << " ran with the wrong loss scale";
  }
}

// ABORT of window 2: the BeginWindow riding on it for window 3 of that generation is not
// answered (its generation is over) and dropped; the next generation retries window 2 with a
// fresh BeginWindow, and window 3's rides again, in its own generation.
// Catches: the pipelined ABORTED read as the retried window's answer (or as a failure), the
// retry skipping its BeginWindow, or the old generation's request reused in the new one.
TEST_F(WorkerTest, AbortDropsThePipelinedBeginAndTheRetryBeginsAfresh) {
  coordinator_.AbortFirstAttemptOf(2);
  Worker worker(Options());
  const WorkerExit exit = worker.Run();
  ASSERT_EQ(exit.code, 0) << exit.message;
  EXPECT_TRUE(coordinator_.failures().empty());
  const std::vector<std::string> e = coordinator_.events();
  const std::string all = absl::StrJoin(e, "\n");
  EXPECT_LT(IndexOf(e, "decide 1.2 ABORT"), IndexOf(e, "answer 1.3 ABORTED")) << all;
  EXPECT_LT(IndexOf(e, "answer 1.3 ABORTED"), IndexOf(e, "begin 2.2")) << all;
  EXPECT_LT(IndexOf(e, "begin 2.2"), IndexOf(e, "complete 2.2")) << all;
  EXPECT_EQ(IndexOf(e, "complete 1.3"), e.size()) << all;  // nothing of window 3 in generation 1
  EXPECT_LT(IndexOf(e, "begin 2.3"), IndexOf(e, "decide 2.2 COMMIT")) << all;
  const std::vector<v1::CompleteWindowRequest> c = coordinator_.completes();
  ASSERT_EQ(c.size(), 4u);
  EXPECT_EQ(c[3].generation(), 2);
  EXPECT_EQ(c[3].window_id(), 3);
  EXPECT_DOUBLE_EQ(c[1].loss_sum(), c[2].loss_sum());  // window 2 again, from the same weights
}

// The job stops after window 2 though the spec's stop is later (the worker could not foresee
// it): the BeginWindow riding on window 2's CompleteWindow is not answered (there is no
// window 3).
// Catches: that answer taken as this worker's failure (exit 1, the job failed by it), or the
// worker running window 3 anyway.
TEST_F(WorkerTest, StopAfterAWindowIsNotAnErrorOfThePipelinedBegin) {
  coordinator_.StopAfterUpdates(2);
  Worker worker(Options());
  const WorkerExit exit = worker.Run();
  EXPECT_EQ(exit.code, 0) << exit.message;
  EXPECT_NE(exit.message.find("SUCCEEDED"), std::string::npos) << exit.message;
  EXPECT_TRUE(coordinator_.failures().empty());
  const std::vector<std::string> e = coordinator_.events();
  const std::string all = absl::StrJoin(e, "\n");
  EXPECT_LT(IndexOf(e, "begin 1.3"), IndexOf(e, "decide 1.2 COMMIT")) << all;
  EXPECT_LT(IndexOf(e, "answer 1.3 FAILED_PRECONDITION"), e.size()) << all;
  EXPECT_EQ(std::count(e.begin(), e.end(), "begin 1.3"), 1) << all;
  EXPECT_EQ(coordinator_.completes().size(), 2u);
}

// --pipeline-begin=false: every window's BeginWindow is sent when the window starts, after the
// previous window's CompleteWindow returned, once, exactly as before pipelining (an abort
// included).
// Catches: the switch that does not switch, or a request sent ahead anyway.
TEST_F(WorkerTest, WithoutPipeliningEachBeginIsSentWhenItsWindowStarts) {
  coordinator_.AbortFirstAttemptOf(2);
  WorkerOptions o = Options();
  o.pipeline_begin = false;
  Worker worker(o);
  const WorkerExit exit = worker.Run();
  ASSERT_EQ(exit.code, 0) << exit.message;
  const std::vector<std::string> expected = {
      "begin 1.1", "answer 1.1 1", "complete 1.1", "decide 1.1 COMMIT", "return 1.1",
      "begin 1.2", "answer 1.2 1", "complete 1.2", "decide 1.2 ABORT",  "return 1.2",
      "begin 2.2", "answer 2.2 1", "complete 2.2", "decide 2.2 COMMIT", "return 2.2",
      "begin 2.3", "answer 2.3 1", "complete 2.3", "decide 2.3 COMMIT", "return 2.3"};
  EXPECT_EQ(coordinator_.events(), expected);
}

}  // namespace
}  // namespace trainstep
