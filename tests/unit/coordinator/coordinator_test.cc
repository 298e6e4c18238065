#include "coordinator/coordinator.h"

#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/env.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/coordinator/coordinator_fixture.h"
#include "tests/unit/coordinator/disk_full_env.h"
#include "tests/unit/coordinator/machine_test_util.h"
#include "tests/unit/coordinator/recording_metrics.h"
#include "tests/unit/coordinator/sync_gate.h"

namespace trainstep {
namespace {

using testing_util::Call;
using testing_util::CoordinatorTest;
using testing_util::RecordingMetrics;
using testing_util::SpecJson;
using testing_util::SpecOptions;

// Catches: a barrier call answered before every rank called, or never answered when the
// last rank arrives (waiters not re-polled on change).
TEST_F(CoordinatorTest, BarrierAnswersOnlyWhenAllRanksCalled) {
  const std::string job = Submit(3);
  const std::vector<std::string> ranks = StartWorkers(job, 3);
  Call<v1::BeginWindowResponse> b0, b1, b2;
  coordinator_->BeginWindow(Begin(job, ranks, 0, 1, 5), b0.done(), std::make_shared<CallHandle>());
  coordinator_->BeginWindow(Begin(job, ranks, 1, 1, 6), b1.done(), std::make_shared<CallHandle>());
  EXPECT_FALSE(b0.answered());
  EXPECT_FALSE(b1.answered());
  coordinator_->BeginWindow(Begin(job, ranks, 2, 1, 7), b2.done(), std::make_shared<CallHandle>());
  for (Call<v1::BeginWindowResponse>* b : {&b0, &b1, &b2}) {
    absl::StatusOr<v1::BeginWindowResponse> r = b->Get();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->global_valid_units(), 18);
    EXPECT_EQ(b->calls(), 1);
  }

  Call<v1::CompleteWindowResponse> c0, c1, c2;
  coordinator_->CompleteWindow(Complete(job, ranks, 0, 1, 5), c0.done(), nullptr);
  coordinator_->CompleteWindow(Complete(job, ranks, 1, 1, 6), c1.done(), nullptr);
  EXPECT_FALSE(c0.answered());
  EXPECT_FALSE(c1.answered());
  coordinator_->CompleteWindow(Complete(job, ranks, 2, 1, 7), c2.done(), nullptr);
  std::string first;
  for (Call<v1::CompleteWindowResponse>* c : {&c0, &c1, &c2}) {
    absl::StatusOr<v1::CompleteWindowResponse> r = c->Get();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->decision().outcome(), v1::COMMIT);
    if (first.empty()) first = r->decision().SerializeAsString();
    EXPECT_EQ(r->decision().SerializeAsString(), first);  // every rank gets the same decision
  }
  absl::StatusOr<v1::Job> j = GetJob(job);
  ASSERT_TRUE(j.ok());
  EXPECT_EQ(j->progress().optimizer_update_id(), 1);
}

// A BeginWindow for the window after the one in progress (a worker sends it ahead, pipelined)
// is held, then answered in the round that journals the decision — with no further call — with
// what follows the decision: the backed-off scale after a SKIP, the update id, scheduler step
// and learning rate after a COMMIT.
// Catches: a held begin answered before the decision (with the scale, lr or ids of before it),
// or left waiting after it (answered only at some later change, or never).
TEST_F(CoordinatorTest, HeldBeginIsAnsweredInTheDecisionsRoundWithWhatFollowsIt) {
  SpecOptions o;
  o.workers = 2;
  o.precision = "fp16";
  o.loss_scaler = R"({"init_scale":1024,"growth_interval":1000})";
  o.max_updates = 100;
  o.schedule = R"({"warmup_linear":{"warmup_updates":4,"total_updates":100}})";
  const std::string job = Submit(o);
  const std::vector<std::string> ranks = StartWorkers(job, 2);
  Call<v1::BeginWindowResponse> b1[2];
  for (int r = 0; r < 2; ++r) {
    coordinator_->BeginWindow(Begin(job, ranks, r, 1, 10), b1[r].done(),
                              std::make_shared<CallHandle>());
  }
  for (Call<v1::BeginWindowResponse>& b : b1) {
    absl::StatusOr<v1::BeginWindowResponse> r = b.Get();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->loss_scale(), 1024);
  }

  // Window 2's begins, sent ahead while window 1 computes: held.
  Call<v1::BeginWindowResponse> b2[2];
  for (int r = 0; r < 2; ++r) {
    coordinator_->BeginWindow(Begin(job, ranks, r, 2, 7), b2[r].done(),
                              std::make_shared<CallHandle>());
  }
  EXPECT_FALSE(b2[0].answered());
  EXPECT_FALSE(b2[1].answered());
  // Window 1 overflows: SKIP, and the scale backs off.
  Call<v1::CompleteWindowResponse> c1[2];
  for (int r = 0; r < 2; ++r) {
    v1::CompleteWindowRequest req = Complete(job, ranks, r, 1, 10);
    req.set_found_inf(true);
    coordinator_->CompleteWindow(req, c1[r].done(), nullptr);
  }
  for (Call<v1::CompleteWindowResponse>& c : c1) {
    absl::StatusOr<v1::CompleteWindowResponse> r = c.Get();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->decision().outcome(), v1::SKIP);
  }
  // Nothing else happens before these answers: they come from the decision's round.
  for (Call<v1::BeginWindowResponse>& b : b2) {
    absl::StatusOr<v1::BeginWindowResponse> r = b.Get();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_FALSE(r->has_decision());
    EXPECT_EQ(r->global_valid_units(), 14);
    EXPECT_EQ(r->loss_scale(), 512);
    EXPECT_EQ(r->optimizer_update_id(), 0);
    EXPECT_EQ(r->scheduler_step(), 0);
    EXPECT_DOUBLE_EQ(r->learning_rate(), 0.1 * 0.25);
  }

  // Window 3's begins are held during window 2, which commits.
  Call<v1::BeginWindowResponse> b3[2];
  for (int r = 0; r < 2; ++r) {
    coordinator_->BeginWindow(Begin(job, ranks, r, 3, 5), b3[r].done(),
                              std::make_shared<CallHandle>());
  }
  Call<v1::CompleteWindowResponse> c2[2];
  for (int r = 0; r < 2; ++r) {
    coordinator_->CompleteWindow(Complete(job, ranks, r, 2, 7), c2[r].done(), nullptr);
  }
  for (Call<v1::CompleteWindowResponse>& c : c2) {
    absl::StatusOr<v1::CompleteWindowResponse> r = c.Get();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->decision().outcome(), v1::COMMIT);
  }
  for (Call<v1::BeginWindowResponse>& b : b3) {
    absl::StatusOr<v1::BeginWindowResponse> r = b.Get();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->global_valid_units(), 10);
    EXPECT_EQ(r->loss_scale(), 512);
    EXPECT_EQ(r->optimizer_update_id(), 1);
    EXPECT_EQ(r->scheduler_step(), 1);
    EXPECT_DOUBLE_EQ(r->learning_rate(), 0.1 * 0.5);
  }
}

// A held BeginWindow(w+1) whose window w aborts (a rank's lease expires) is answered ABORTED:
// its generation is over; the new generation's window w is a new call. And one held when the
// job's stop comes after w is answered FAILED_PRECONDITION.
// Catches: a held begin answered as if it were the retried window's (OK, or a decision), or
// left waiting when its window can never start.
TEST_F(CoordinatorTest, HeldBeginIsAbortedWithItsWindowAndRefusedAfterTheStop) {
  {
    const std::string job = Submit(2);
    const std::vector<std::string> ranks = StartWorkers(job, 2);
    Call<v1::BeginWindowResponse> b1[2];
    for (int r = 0; r < 2; ++r) {
      coordinator_->BeginWindow(Begin(job, ranks, r, 1, 10), b1[r].done(), nullptr);
    }
    for (Call<v1::BeginWindowResponse>& b : b1) ASSERT_TRUE(b.Get().ok());
    Call<v1::BeginWindowResponse> ahead;
    coordinator_->BeginWindow(Begin(job, ranks, 0, 2, 10), ahead.done(),
                              std::make_shared<CallHandle>());
    EXPECT_FALSE(ahead.answered());
    clock_.Advance(absl::Seconds(6));
    ASSERT_TRUE(Heartbeat(job, ranks[0]).ok());
    clock_.Advance(absl::Seconds(5));
    coordinator_->Tick();  // rank 1's lease expired: window 1 aborts
    absl::StatusOr<v1::BeginWindowResponse> r = ahead.Get();
    EXPECT_EQ(r.status().code(), absl::StatusCode::kAborted) << r.status();
    absl::StatusOr<v1::Job> j = GetJob(job);
    ASSERT_TRUE(j.ok());
    EXPECT_EQ(j->progress().windows_aborted(), 1);
    EXPECT_EQ(j->progress().window_id(), 0);  // window 1 is retried, under its id
  }
  {
    SpecOptions o;
    o.workers = 2;
    o.max_updates = 1;
    const std::string job = Submit(o);
    const std::vector<std::string> ranks = StartWorkers(job, 2);
    Call<v1::BeginWindowResponse> b1[2];
    for (int r = 0; r < 2; ++r) {
      coordinator_->BeginWindow(Begin(job, ranks, r, 1, 10), b1[r].done(), nullptr);
    }
    for (Call<v1::BeginWindowResponse>& b : b1) ASSERT_TRUE(b.Get().ok());
    Call<v1::BeginWindowResponse> ahead[2];
    for (int r = 0; r < 2; ++r) {
      coordinator_->BeginWindow(Begin(job, ranks, r, 2, 10), ahead[r].done(),
                                std::make_shared<CallHandle>());
    }
    Call<v1::CompleteWindowResponse> c1[2];
    for (int r = 0; r < 2; ++r) {
      coordinator_->CompleteWindow(Complete(job, ranks, r, 1, 10), c1[r].done(), nullptr);
    }
    for (Call<v1::CompleteWindowResponse>& c : c1) {
      absl::StatusOr<v1::CompleteWindowResponse> r = c.Get();
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_TRUE(r->decision().job_done());
    }
    for (Call<v1::BeginWindowResponse>& b : ahead) {
      absl::StatusOr<v1::BeginWindowResponse> r = b.Get();
      EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
    }
  }
}

// Catches: metrics fed out of journal order, with the job as it was before the record, or
// missing records (the dashboards' update counter would disagree with `trainstep job get`).
TEST_F(CoordinatorTest, MetricsSeeEveryRecordAfterItIsApplied) {
  const std::string job = Submit(2);
  const std::vector<std::string> ranks = StartWorkers(job, 2);
  RunWindow(job, ranks, 1);
  RunWindow(job, ranks, 2);
  std::vector<int64_t> updates_seen;
  bool submitted_first = false;
  const std::vector<RecordingMetrics::Recorded> recorded = metrics_.records();
  ASSERT_FALSE(recorded.empty());
  submitted_first = recorded.front().record.has_job_submitted();
  for (const RecordingMetrics::Recorded& r : recorded) {
    if (r.record.has_window_ended()) {
      updates_seen.push_back(r.job.progress().optimizer_update_id());
      EXPECT_EQ(r.record.window_ended().decision().optimizer_update_id(),
                r.job.progress().optimizer_update_id());
    }
  }
  EXPECT_TRUE(submitted_first);
  EXPECT_EQ(updates_seen, (std::vector<int64_t>{1, 2}));
  // The journal fsyncs that made them durable were timed.
  EXPECT_FALSE(metrics_.fsyncs().empty());
}

// Catches: the job-state gauge or the worker list not refreshed when a job or its
// membership changes (a dashboard showing a running job as pending).
TEST_F(CoordinatorTest, MetricsSeeJobStatesAndWorkers) {
  const std::string job = Submit(2);
  ASSERT_FALSE(metrics_.job_states().empty());
  EXPECT_EQ(metrics_.job_states().back().size(), 1u);
  EXPECT_EQ(metrics_.job_states().back()[0].state(), v1::PENDING);
  StartWorkers(job, 2);
  EXPECT_EQ(metrics_.job_states().back()[0].state(), v1::RUNNING);
  EXPECT_EQ(metrics_.workers(job).size(), 2u);
}

// Catches: barrier waits not observed, or a refused call not counted.
TEST_F(CoordinatorTest, MetricsSeeBarrierWaitsAndRejections) {
  const std::string job = Submit(2);
  const std::vector<std::string> ranks = StartWorkers(job, 2);
  RunWindow(job, ranks, 1);
  int begins = 0, completes = 0;
  for (const auto& [phase, seconds] : metrics_.barrier_waits()) {
    EXPECT_GE(seconds, 0.0);
    begins += phase == "begin";
    completes += phase == "complete";
  }
  EXPECT_EQ(begins, 2);
  EXPECT_EQ(completes, 2);
  // Window 1 again, in a generation that does not exist: refused and counted.
  absl::StatusOr<v1::BeginWindowResponse> stale =
      Sync<v1::BeginWindowResponse>([&](Done<v1::BeginWindowResponse> d) {
        coordinator_->BeginWindow(Begin(job, ranks, 0, 1, 5, /*generation=*/7), std::move(d),
                                  nullptr);
      });
  EXPECT_FALSE(stale.ok());
  ASSERT_EQ(metrics_.rejected().size(), 1u);
  EXPECT_EQ(metrics_.rejected()[0].first, "BeginWindow");
  EXPECT_EQ(metrics_.rejected()[0].second, absl::StatusCodeToString(stale.status().code()));
}

// Catches: an abandoned call (deadline, client gone) that the coordinator keeps polling
// and answers later.
TEST_F(CoordinatorTest, ClaimedHandleStopsTheWaiter) {
  const std::string job = Submit(2);
  const std::vector<std::string> ranks = StartWorkers(job, 2);
  auto handle = std::make_shared<CallHandle>();
  Call<v1::BeginWindowResponse> abandoned;
  coordinator_->BeginWindow(Begin(job, ranks, 0, 1, 5), abandoned.done(), handle);
  EXPECT_FALSE(abandoned.answered());
  ASSERT_TRUE(handle->Claim());  // the RPC layer gave up on it

  Call<v1::BeginWindowResponse> last;
  coordinator_->BeginWindow(Begin(job, ranks, 1, 1, 6), last.done(),
                            std::make_shared<CallHandle>());
  ASSERT_TRUE(last.Get().ok());
  clock_.Advance(absl::Seconds(1));
  coordinator_->Tick();
  coordinator_.reset();  // shutdown answers every remaining waiter and flushes deliveries
  EXPECT_EQ(abandoned.calls(), 0);
}

// Catches: waiters left hanging at shutdown, or calls accepted after it.
TEST_F(CoordinatorTest, ShutdownAnswersWaitersUnavailable) {
  const std::string job = Submit(1);
  Call<v1::StoreGetResponse> get;
  v1::StoreGetRequest req;
  req.set_job_id(job);
  req.set_key("never");
  coordinator_->StoreGet(req, get.done(), std::make_shared<CallHandle>());
  EXPECT_FALSE(get.answered());
  coordinator_->Shutdown();
  absl::StatusOr<v1::StoreGetResponse> r = get.Get();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(GetJob(job).status().code(), absl::StatusCode::kUnavailable);
  coordinator_->Shutdown();  // idempotent
  EXPECT_EQ(get.calls(), 1);
}

// Catches: a watch that resends an unchanged job without end. A job whose spec holds a
// google.protobuf.Struct (an inline llama config) serializes its map entries in whatever order
// a copy iterates them; compared by those bytes, every fetch looked like news, and the
// stream spun the coordinator and the client at full CPU beside the training.
TEST_F(CoordinatorTest, WatchWaitsForNewsOnAJobWithAStructInItsSpec) {
  SpecOptions o;
  o.workers = 1;
  o.model = R"({"llama":{"config":{"hidden_size":8,"intermediate_size":16,)"
            R"("num_hidden_layers":1,"num_attention_heads":2,"num_key_value_heads":1,)"
            R"("vocab_size":300,"rms_norm_eps":1e-5,"rope_theta":10000.0,)"
            R"("max_position_embeddings":64,"tie_word_embeddings":true,"attention_bias":false,)"
            R"("hidden_act":"silu","initializer_range":0.02,"bos_token_id":1,"eos_token_id":2,)"
            R"("torch_dtype":"bfloat16","model_type":"llama","use_cache":true}}})";
  const std::string job = Submit(o);
  ASSERT_FALSE(job.empty());
  Call<WatchBatch> first;
  coordinator_->WatchJob(job, WatchCursor{}, first.done(), std::make_shared<CallHandle>());
  absl::StatusOr<WatchBatch> batch = first.Get();
  ASSERT_TRUE(batch.ok()) << batch.status();
  ASSERT_TRUE(batch->job.has_value());
  // Nothing changes from here: every later fetch must wait, and shutdown answers it.
  std::vector<Call<WatchBatch>> later(5);
  for (Call<WatchBatch>& fetch : later) {
    coordinator_->WatchJob(job, batch->cursor, fetch.done(), std::make_shared<CallHandle>());
  }
  coordinator_->Shutdown();
  for (Call<WatchBatch>& fetch : later) {
    EXPECT_EQ(fetch.Get().status().code(), absl::StatusCode::kUnavailable)
        << "a fetch was answered with a job that had not changed";
  }
}

// Catches: state acknowledged to callers but lost across a restart (the journal not
// written, or not replayed), ids reused after it, or the micro-step id and the update
// interval starting again from zero after it.
TEST_F(CoordinatorTest, ReopenRestoresJobUpdatesAndIds) {
  const std::string job = Submit(2);
  const std::vector<std::string> ranks = StartWorkers(job, 2);
  RunWindow(job, ranks, 1);
  RunWindow(job, ranks, 2);
  absl::StatusOr<v1::Job> before = GetJob(job);
  ASSERT_TRUE(before.ok());
  ASSERT_EQ(before->progress().optimizer_update_id(), 2);
  v1::ListUpdatesRequest lu;
  lu.set_job_id(job);
  absl::StatusOr<v1::ListUpdatesResponse> updates_before = Sync<v1::ListUpdatesResponse>(
      [&](Done<v1::ListUpdatesResponse> d) { coordinator_->ListUpdates(lu, std::move(d)); });
  ASSERT_TRUE(updates_before.ok());

  Reopen();
  absl::StatusOr<v1::Job> after = GetJob(job);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->SerializeAsString(), before->SerializeAsString());
  absl::StatusOr<v1::ListUpdatesResponse> updates_after = Sync<v1::ListUpdatesResponse>(
      [&](Done<v1::ListUpdatesResponse> d) { coordinator_->ListUpdates(lu, std::move(d)); });
  ASSERT_TRUE(updates_after.ok());
  EXPECT_EQ(updates_after->SerializeAsString(), updates_before->SerializeAsString());

  // The workers carry on in the same generation (their leases restarted at open).
  absl::StatusOr<v1::HeartbeatResponse> hb = Heartbeat(job, ranks[0]);
  ASSERT_TRUE(hb.ok()) << hb.status();
  EXPECT_TRUE(hb->assigned());
  EXPECT_EQ(hb->assignment().generation(), 1);
  // What the log derives from the decisions carries on from the journal: the cumulative
  // micro-step id, and the wall-clock interval from the last commit before the restart.
  clock_.Advance(absl::Milliseconds(2500));
  const v1::WindowDecision d3 = RunWindow(job, ranks, 3);
  EXPECT_EQ(d3.optimizer_update_id(), 3);
  EXPECT_EQ(d3.record().micro_step_id(), 3 * 2 * 2);  // 3 windows × 2 ranks × 2 micro-steps
  EXPECT_DOUBLE_EQ(d3.record().update_interval_seconds(), 2.5);
  EXPECT_EQ(Submit(1), "job-2");
}

// Catches: a snapshot that loses state, or a restart from snapshot + log tail that replays
// records twice or not at all.
TEST_F(CoordinatorTest, ReopenFromSnapshotAndLogTail) {
  snapshot_every_records_ = 1;
  Reopen();
  const std::string job = Submit(2);
  const std::vector<std::string> ranks = StartWorkers(job, 2);
  RunWindow(job, ranks, 1);
  coordinator_->Tick();      // starts a snapshot, which the journal writes on its own thread
  RunWindow(job, ranks, 2);  // in the log after it, whether or not the snapshot is done yet
  absl::StatusOr<v1::Job> before = GetJob(job);
  ASSERT_TRUE(before.ok());
  snapshot_every_records_ = 10000;
  Reopen();  // the old coordinator finished the snapshot before closing its journal
  absl::StatusOr<std::vector<std::string>> files = Env::Default()->ListDir(dir_);
  ASSERT_TRUE(files.ok());
  EXPECT_TRUE(std::any_of(files->begin(), files->end(), [](const std::string& f) {
    return f.rfind("snapshot-", 0) == 0 && f.find(".tmp") == std::string::npos;
  }));
  EXPECT_TRUE(coordinator_->recovery_warnings().empty());
  absl::StatusOr<v1::Job> after = GetJob(job);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->SerializeAsString(), before->SerializeAsString());
  EXPECT_EQ(after->progress().optimizer_update_id(), 2);
  EXPECT_EQ(after->progress().micro_step_id(), 8);
  clock_.Advance(absl::Milliseconds(1500));
  const v1::WindowDecision d3 = RunWindow(job, ranks, 3);
  EXPECT_EQ(d3.optimizer_update_id(), 3);
  EXPECT_EQ(d3.record().micro_step_id(), 12);
  EXPECT_DOUBLE_EQ(d3.record().update_interval_seconds(), 1.5);
}

// Catches: Tick writing the snapshot under the coordinator's lock, so that every
// call, reads included, stalls for the snapshot's write, fsync, rename and directory fsync.
// The snapshot's fsync is held open; Tick must return and calls that journal a record must be
// answered meanwhile. Tick and the call run on their own threads so that the old behaviour
// fails (Call's bounded wait) instead of hanging the test.
TEST_F(CoordinatorTest, CallsAreAnsweredWhileASnapshotIsWritten) {
  snapshot_every_records_ = 1;
  env_ = &gate_;
  Reopen();
  const std::string job = Submit(2);
  gate_.HoldNext();
  Call<bool> ticked;
  std::thread tick([&, done = ticked.done()] {
    coordinator_->Tick();
    done(absl::StatusOr<bool>(true));
  });
  gate_.WaitUntilHeld();
  Call<v1::Job> submitted;
  Call<v1::Job> read;
  std::thread rpc([&, submit_done = submitted.done(), read_done = read.done()] {
    v1::SubmitJobRequest submit;
    SpecOptions o;
    o.workers = 1;
    submit.set_spec_json(SpecJson(o));
    coordinator_->SubmitJob(submit, submit_done);
    v1::GetJobRequest get;
    get.set_job_id(job);
    coordinator_->GetJob(get, read_done);
  });
  const absl::StatusOr<bool> tick_result = ticked.Get();
  const absl::StatusOr<v1::Job> second = submitted.Get();
  const absl::StatusOr<v1::Job> first = read.Get();
  gate_.Release();
  tick.join();
  rpc.join();
  EXPECT_TRUE(tick_result.ok()) << "Tick waited for the snapshot's fsync";
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->job_id(), "job-2");
  EXPECT_TRUE(first.ok()) << first.status();

  // The snapshot (job-1) and the record journaled while it was written (job-2) both recover.
  snapshot_every_records_ = 10000;
  Reopen();
  EXPECT_TRUE(coordinator_->recovery_warnings().empty());
  EXPECT_TRUE(GetJob(job).ok());
  EXPECT_TRUE(GetJob("job-2").ok());
  absl::StatusOr<std::vector<std::string>> files = Env::Default()->ListDir(dir_);
  ASSERT_TRUE(files.ok());
  EXPECT_TRUE(std::any_of(files->begin(), files->end(), [](const std::string& f) {
    return f.rfind("snapshot-", 0) == 0 && f.find(".tmp") == std::string::npos;
  }));
}

// Catches: lease expiry that the driver never applies, or a waiting barrier call that is
// not answered when its window is aborted.
TEST_F(CoordinatorTest, TickExpiresLeasesAndAnswersWaiters) {
  const std::string job = Submit(2);
  const std::vector<std::string> ranks = StartWorkers(job, 2);
  Call<v1::BeginWindowResponse> waiting;
  coordinator_->BeginWindow(Begin(job, ranks, 0, 1, 5), waiting.done(),
                            std::make_shared<CallHandle>());
  EXPECT_FALSE(waiting.answered());
  clock_.Advance(absl::Seconds(6));
  ASSERT_TRUE(Heartbeat(job, ranks[0]).ok());
  clock_.Advance(absl::Seconds(5));
  coordinator_->Tick();
  absl::StatusOr<v1::BeginWindowResponse> r = waiting.Get();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->decision().outcome(), v1::ABORT);
  EXPECT_EQ(r->decision().reason(), "WORKER_LOST");
  absl::StatusOr<v1::Job> j = GetJob(job);
  ASSERT_TRUE(j.ok());
  EXPECT_EQ(j->progress().windows_aborted(), 1);
}

// Catches the probe's coordinator pause through the Coordinator and its driver: a Tick long
// after the previous one (the process was stopped; heartbeats queued unread) expired every
// lease. It must restart the leases instead, keep asking to be ticked often, and still expire
// a worker that stays silent for a whole lease afterwards.
TEST_F(CoordinatorTest, StalledTickRenewsLeasesInsteadOfExpiring) {
  const std::string job = Submit(2);
  const std::vector<std::string> ranks = StartWorkers(job, 2);
  coordinator_->Tick();
  Call<v1::BeginWindowResponse> waiting;
  coordinator_->BeginWindow(Begin(job, ranks, 0, 1, 5), waiting.done(),
                            std::make_shared<CallHandle>());
  clock_.Advance(absl::Seconds(30));  // stopped for three leases
  absl::Time next = coordinator_->Tick();
  EXPECT_LE(next, clock_.Now() + absl::Milliseconds(2500));  // a quarter lease at most
  EXPECT_FALSE(waiting.answered());
  absl::StatusOr<v1::Job> j = GetJob(job);
  ASSERT_TRUE(j.ok());
  EXPECT_EQ(j->progress().windows_aborted(), 0);
  for (const std::string& w : ranks) EXPECT_TRUE(Heartbeat(job, w).ok());  // they were queued

  // Ticking on time from here: rank 1 falls silent and is lost one lease later.
  for (int i = 0; i < 6 && !waiting.answered(); ++i) {
    clock_.Advance(absl::Milliseconds(2400));
    ASSERT_TRUE(Heartbeat(job, ranks[0]).ok());
    next = coordinator_->Tick();
  }
  absl::StatusOr<v1::BeginWindowResponse> r = waiting.Get();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->decision().reason(), "WORKER_LOST");
}

// Catches the unbounded stall guard through the Coordinator: when every tick came more than
// half a lease late, each renewed every lease, so a rank that stopped heartbeating was never
// lost and the window waiting for it never ended.
TEST_F(CoordinatorTest, EveryTickLateStillExpiresASilentWorker) {
  const std::string job = Submit(2);
  const std::vector<std::string> ranks = StartWorkers(job, 2);
  coordinator_->Tick();
  Call<v1::BeginWindowResponse> waiting;
  coordinator_->BeginWindow(Begin(job, ranks, 0, 1, 5), waiting.done(),
                            std::make_shared<CallHandle>());
  // Ticks 6 s apart against a 10 s lease; rank 0 heartbeats between them, rank 1 is silent.
  for (int i = 0; i < 10 && !waiting.answered(); ++i) {
    clock_.Advance(absl::Seconds(6));
    ASSERT_TRUE(Heartbeat(job, ranks[0]).ok());
    coordinator_->Tick();
  }
  ASSERT_TRUE(waiting.answered());
  absl::StatusOr<v1::BeginWindowResponse> r = waiting.Get();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->decision().reason(), "WORKER_LOST");
}

// Catches the crash a probe found: Open failing after the Coordinator object exists ran
// ~Coordinator → Shutdown on a journal that was never created (a segfault instead of the
// error naming the file and offset).
TEST_F(CoordinatorTest, OpenFailureReturnsTheErrorInsteadOfCrashing) {
  Submit(1);
  Submit(1);
  coordinator_.reset();
  const std::string log = dir_ + "/log-000001";
  {
    std::fstream f(log, std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(f.good());
    f.seekp(16 + 3);  // the first record's length, high byte (under its header checksum)
    f.put('\x7f');
  }
  CoordinatorOptions options;
  options.state_dir = dir_;
  options.clock = &clock_;
  absl::StatusOr<std::unique_ptr<Coordinator>> c = Coordinator::Open(options);
  ASSERT_TRUE(absl::IsDataLoss(c.status())) << c.status();
  EXPECT_THAT(std::string(c.status().message()),
              ::testing::HasSubstr(log + " is damaged at byte offset 16"));

  options.state_dir = log;  // a file, not a directory
  c = Coordinator::Open(options);
  EXPECT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()), ::testing::HasSubstr(log));
}

// --- When the journal cannot be written ---

class StorageFaultTest : public CoordinatorTest {
 protected:
  void SetUp() override {
    env_ = &disk_;
    CoordinatorTest::SetUp();
  }
  absl::StatusOr<v1::Job> SubmitAs(const std::string& request_id) {
    v1::SubmitJobRequest req;
    req.set_request_id(request_id);
    SpecOptions o;
    req.set_spec_json(SpecJson(o));
    return Sync<v1::Job>([&](Done<v1::Job> d) { coordinator_->SubmitJob(req, std::move(d)); });
  }
  size_t JobCount() {
    absl::StatusOr<v1::ListJobsResponse> list = Sync<v1::ListJobsResponse>(
        [&](Done<v1::ListJobsResponse> d) { coordinator_->ListJobs({}, std::move(d)); });
    EXPECT_TRUE(list.ok()) << list.status();
    return list.ok() ? list->jobs_size() : 0;
  }

  DiskFullEnv disk_{Env::Default()};  // outlives coordinator_
};

// Catches the coordinator stopping (a crash loop under Kubernetes) on a full disk; a held
// decision answered as made; reads refused while held; leases expiring while heartbeats are
// refused; and a resume that loses, repeats or forgets a record.
TEST_F(StorageFaultTest, AFullDiskHoldsDecisionsServesReadsAndResumesWithNothingLost) {
  const std::string job = Submit(2);
  const std::vector<std::string> ranks = StartWorkers(job, 2);
  ASSERT_EQ(RunWindow(job, ranks, 1).outcome(), v1::COMMIT);

  disk_.SetFull(true);
  absl::StatusOr<v1::Job> held = SubmitAs("second");
  ASSERT_TRUE(absl::IsUnavailable(held.status())) << held.status();
  EXPECT_THAT(std::string(held.status().message()),
              ::testing::HasSubstr("holds every decision until it can"));
  EXPECT_THAT(std::string(held.status().message()),
              ::testing::HasSubstr("No space left on device"));
  EXPECT_FALSE(coordinator_->deciding());
  EXPECT_EQ(metrics_.journal_writable(), std::vector<bool>{false});

  // Decisions are refused at once (not parked), reads are served.
  Call<v1::BeginWindowResponse> begin;
  coordinator_->BeginWindow(Begin(job, ranks, 0, 2, 10), begin.done(), nullptr);
  ASSERT_TRUE(begin.answered());
  EXPECT_TRUE(absl::IsUnavailable(begin.Get().status()));
  EXPECT_TRUE(absl::IsUnavailable(Heartbeat(job, ranks[1]).status()));
  absl::StatusOr<v1::Job> read = GetJob(job);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->progress().optimizer_update_id(), 1);

  // Still full: a minute passes, nobody's lease expires, and the job waits.
  clock_.Advance(absl::Seconds(60));
  coordinator_->Tick();
  EXPECT_FALSE(coordinator_->deciding());

  disk_.SetFull(false);
  coordinator_->Tick();
  ASSERT_TRUE(coordinator_->deciding());
  EXPECT_EQ(metrics_.journal_writable(), (std::vector<bool>{false, true}));
  const v1::WindowDecision d = RunWindow(job, ranks, 2);  // the same ranks, leases intact
  EXPECT_EQ(d.outcome(), v1::COMMIT);
  EXPECT_EQ(d.optimizer_update_id(), 2);
  // The held submit was kept (the snapshot holds it): its retry finds it, not a second job.
  absl::StatusOr<v1::Job> retried = SubmitAs("second");
  ASSERT_TRUE(retried.ok()) << retried.status();
  EXPECT_EQ(JobCount(), 2u);

  Reopen();  // what is on disk replays to the same state
  EXPECT_EQ(JobCount(), 2u);
  absl::StatusOr<v1::Job> replayed = GetJob(job);
  ASSERT_TRUE(replayed.ok()) << replayed.status();
  EXPECT_EQ(replayed->progress().optimizer_update_id(), 2);
}

// Catches a coordinator that trusts the log whose fsync failed (a retried fsync can report
// success for pages the kernel dropped): it resumes in a fresh log beside a snapshot of its
// state, and the failed log is gone, without a record lost or repeated.
TEST_F(StorageFaultTest, AFailedFsyncIsNotRetriedOnTheSameLog) {
  const std::string job = Submit(1);
  disk_.FailNextSync();
  ASSERT_TRUE(absl::IsUnavailable(SubmitAs("second").status()));
  EXPECT_FALSE(coordinator_->deciding());
  coordinator_->Tick();  // the disk works again: resumes at once
  ASSERT_TRUE(coordinator_->deciding());
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/log-000001"));
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/log-000002"));
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/snapshot-000002"));
  ASSERT_TRUE(SubmitAs("second").ok());
  ASSERT_TRUE(SubmitAs("third").ok());
  EXPECT_EQ(JobCount(), 3u);
  Reopen();
  EXPECT_EQ(JobCount(), 3u);
  EXPECT_TRUE(GetJob(job).ok());
}

}  // namespace
}  // namespace trainstep
