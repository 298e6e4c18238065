#include "coordinator/job_registry.h"

#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "coordinator/coordinator.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "tests/unit/coordinator/machine_test_util.h"

namespace trainstep {
namespace {

using ::google::protobuf::util::MessageDifferencer;
using ::testing::HasSubstr;
using testing_util::RankReport;
using testing_util::Reports;
using testing_util::ResolvedSpec;
using testing_util::SimulatedRanks;
using testing_util::SpecJson;
using testing_util::SpecOptions;

const absl::Time kT0 = absl::FromUnixSeconds(1'700'000'000);

v1::SubmitJobRequest SubmitJson(const std::string& json, const std::string& request_id = "") {
  v1::SubmitJobRequest req;
  req.set_spec_json(json);
  req.set_request_id(request_id);
  return req;
}

v1::SubmitJobRequest SubmitWorkers(int workers, const std::string& request_id = "") {
  SpecOptions o;
  o.workers = workers;
  return SubmitJson(SpecJson(o), request_id);
}

v1::RegisterWorkerRequest Register(const std::string& job_id, const std::string& request_id = "") {
  v1::RegisterWorkerRequest req;
  req.set_job_id(job_id);
  req.set_request_id(request_id);
  req.set_name("pod");
  return req;
}

v1::CancelJobRequest CancelRequest(const std::string& job_id) {
  v1::CancelJobRequest req;
  req.set_job_id(job_id);
  return req;
}

// Applies every record of `from` to a fresh registry.
std::unique_ptr<JobRegistry> Replay(const std::vector<v1::JournalRecord>& records) {
  auto r = std::make_unique<JobRegistry>(MachineOptions{});
  for (const v1::JournalRecord& rec : records) {
    const absl::Status applied = r->Apply(rec);
    EXPECT_TRUE(applied.ok()) << applied;
  }
  return r;
}

// Catches: a retried SubmitJob that creates a second job, or ids consumed by duplicates.
TEST(JobRegistryTest, SubmitIsIdempotentOnRequestId) {
  JobRegistry reg{MachineOptions{}};
  absl::StatusOr<v1::Job> a = reg.Submit(SubmitWorkers(2, "req-1"), kT0);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->job_id(), "job-1");
  EXPECT_EQ(a->state(), v1::PENDING);
  EXPECT_EQ(a->request_id(), "req-1");
  EXPECT_EQ(a->spec().workers().count(), 2);
  EXPECT_EQ(a->submit_time_ms(), absl::ToUnixMillis(kT0));
  absl::StatusOr<v1::Job> again = reg.Submit(SubmitWorkers(2, "req-1"), kT0 + absl::Seconds(1));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->job_id(), "job-1");
  EXPECT_EQ(again->submit_time_ms(), absl::ToUnixMillis(kT0));  // the first request's job
  EXPECT_EQ(reg.TakeRecords().size(), 1u);

  EXPECT_EQ(reg.Submit(SubmitWorkers(2, "req-2"), kT0)->job_id(), "job-2");
  EXPECT_EQ(reg.Submit(SubmitWorkers(2), kT0)->job_id(), "job-3");
  EXPECT_EQ(reg.Submit(SubmitWorkers(2), kT0)->job_id(), "job-4");  // no request id: no dedup
  EXPECT_EQ(reg.List().size(), 4u);

  // The index survives replay.
  std::vector<v1::JournalRecord> records = reg.TakeRecords();
  std::unique_ptr<JobRegistry> replayed = Replay(records);
  EXPECT_EQ(replayed->Submit(SubmitWorkers(2, "req-2"), kT0)->job_id(), "job-2");
}

// AIP-155: the same request id with a different request is an error naming the id, not the
// first job (a probe got the first job back, silently). "Same" compares the resolved specs,
// so a retry that only differs in formatting or in spelled-out defaults is the same request.
// The comparison must hold after a restart (replay and snapshot).
TEST(JobRegistryTest, ReusedRequestIdWithAnotherSpecIsRefused) {
  JobRegistry reg{MachineOptions{}};
  SpecOptions o;
  o.workers = 2;
  const std::string json = SpecJson(o);
  ASSERT_EQ(reg.Submit(SubmitJson(json, "req-1"), kT0)->job_id(), "job-1");
  // Same spec: extra whitespace and a default written out.
  const std::string same = "  " + json.substr(0, json.size() - 1) + R"(, "seed": 0 } )";
  auto expect_same_and_refused = [&](JobRegistry& r) {
    absl::StatusOr<v1::Job> retry = r.Submit(SubmitJson(same, "req-1"), kT0 + absl::Seconds(5));
    ASSERT_TRUE(retry.ok()) << retry.status();
    EXPECT_EQ(retry->job_id(), "job-1");
    absl::StatusOr<v1::Job> other = r.Submit(SubmitWorkers(3, "req-1"), kT0 + absl::Seconds(5));
    EXPECT_EQ(other.status().code(), absl::StatusCode::kAlreadyExists) << other.status();
    EXPECT_THAT(std::string(other.status().message()),
                HasSubstr("request_id \"req-1\" was already used for job-1 with a different spec"));
    EXPECT_EQ(r.List().size(), 1u);
  };
  expect_same_and_refused(reg);
  EXPECT_EQ(reg.TakeRecords().size(), 1u);

  JobRegistry source{MachineOptions{}};
  ASSERT_TRUE(source.Submit(SubmitJson(json, "req-1"), kT0).ok());
  const v1::CoordinatorSnapshot snapshot = source.Snapshot();
  std::unique_ptr<JobRegistry> replayed = Replay(source.TakeRecords());
  expect_same_and_refused(*replayed);
  JobRegistry restored{MachineOptions{}};
  restored.Restore(snapshot, kT0);
  expect_same_and_refused(restored);
}

// Catches the probe's coordinator pause: after SIGSTOP longer than a lease, the first tick
// expired every lease before the heartbeats queued meanwhile were read, so every worker was
// declared lost and the job failed. A tick long after the previous one is a stall of the
// coordinator: every lease restarts instead, and only a worker silent for a whole lease after
// it is lost.
TEST(JobRegistryTest, StallOfTheCoordinatorRenewsLeasesInsteadOfExpiring) {
  SimulatedRanks sim(ResolvedSpec({}));
  const std::vector<std::string> ids = sim.Start(2);
  JobRegistry& reg = sim.registry();
  const absl::Duration lease = sim.options().worker_lease;
  // A driver ticking on time (NextDeadline asks for a tick at least every lease / 4).
  absl::Time last_tick;
  for (int i = 0; i < 8; ++i) {
    last_tick = sim.now();
    EXPECT_FALSE(reg.Tick(sim.now()).has_value());
    ASSERT_TRUE(reg.NextDeadline().has_value());
    EXPECT_LE(*reg.NextDeadline(), sim.now() + lease / 4);
    sim.Advance(lease / 4);
    sim.HeartbeatAllExcept({});
  }
  // Paused for 1.5 leases, heartbeats queued: nobody is lost.
  sim.Advance(lease + lease / 2);
  sim.Drain();
  const size_t records = sim.records().size();
  const std::optional<JobRegistry::Stall> stall = reg.Tick(sim.now());
  ASSERT_TRUE(stall.has_value());
  EXPECT_EQ(stall->gap, sim.now() - last_tick);
  EXPECT_TRUE(stall->renewed);
  sim.Drain();
  EXPECT_EQ(sim.records().size(), records);
  for (const v1::WorkerInfo& w : sim.machine().Workers()) EXPECT_NE(w.state(), v1::LOST);
  // The queued heartbeat of one worker is read; the other worker really is gone.
  ASSERT_TRUE(sim.Heartbeat(ids[0]).ok());
  for (int i = 0; i < 4; ++i) {
    sim.Advance(lease / 4 + absl::Milliseconds(1));
    EXPECT_FALSE(reg.Tick(sim.now()).has_value());
    sim.Drain();
    if (i < 3) ASSERT_TRUE(sim.Heartbeat(ids[0]).ok());
  }
  for (const v1::WorkerInfo& w : sim.machine().Workers()) {
    EXPECT_EQ(w.state() == v1::LOST, w.worker_id() == ids[1]) << w.worker_id();
  }
}

// Catches the unbounded stall guard: a coordinator whose every tick came more than half a lease
// late renewed every lease on each one, so a worker that stopped heartbeating was never lost.
// Beyond kMaxRenewingStalls late ticks in a row leases expire as usual, and one tick on time
// lets a later pause renew them again.
TEST(JobRegistryTest, LateTicksInARowStopRenewingLeases) {
  SimulatedRanks sim(ResolvedSpec({}));
  const std::vector<std::string> ids = sim.Start(2);
  JobRegistry& reg = sim.registry();
  const absl::Duration late = sim.options().worker_lease * 3 / 5;  // > StallThreshold()
  ASSERT_GT(late, reg.StallThreshold());
  EXPECT_FALSE(reg.Tick(sim.now()).has_value());
  const auto lost = [&](const std::string& id) {
    for (const v1::WorkerInfo& w : sim.machine().Workers()) {
      if (w.worker_id() == id) return w.state() == v1::LOST;
    }
    return false;
  };
  // ids[1] is dead; ids[0] heartbeats between the late ticks (the coordinator runs).
  int ticks = 0;
  for (; ticks < 10 && !lost(ids[1]); ++ticks) {
    sim.Advance(late);
    ASSERT_TRUE(sim.Heartbeat(ids[0]).ok());
    const std::optional<JobRegistry::Stall> stall = reg.Tick(sim.now());
    ASSERT_TRUE(stall.has_value());
    EXPECT_EQ(stall->consecutive, ticks + 1);
    EXPECT_EQ(stall->renewed, ticks < JobRegistry::kMaxRenewingStalls);
    sim.Drain();
  }
  EXPECT_TRUE(lost(ids[1]));
  EXPECT_FALSE(lost(ids[0]));
  // The kMaxRenewingStalls-th renewal gave a lease from then; it ran out two late ticks later.
  EXPECT_EQ(ticks, JobRegistry::kMaxRenewingStalls + 2);

  // On time again: the next pause is a pause, and renews.
  sim.Advance(sim.options().worker_lease / 4);
  EXPECT_FALSE(reg.Tick(sim.now()).has_value());
  sim.Advance(sim.options().worker_lease * 2);
  const std::optional<JobRegistry::Stall> pause = reg.Tick(sim.now());
  ASSERT_TRUE(pause.has_value());
  EXPECT_EQ(pause->consecutive, 1);
  EXPECT_TRUE(pause->renewed);
  EXPECT_FALSE(lost(ids[0]));
}

// Catches: a bad spec that is accepted, creates a job, or fails without naming the field.
TEST(JobRegistryTest, BadSpecNamesTheField) {
  JobRegistry reg{MachineOptions{}};
  const std::string base = R"({"model":{"tiny_gpt":{}},"data":{"text":{"paths":["/d"]}}})";
  absl::StatusOr<v1::Job> unknown =
      reg.Submit(SubmitJson(base.substr(0, base.size() - 1) + R"(,"workers":{"cont":2}})"), kT0);
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(unknown.status().message()), HasSubstr("workers.cont"));

  absl::StatusOr<v1::Job> zero = reg.Submit(
      SubmitJson(base.substr(0, base.size() - 1) + R"(,"batch":{"micro_batch_size":0}})"), kT0);
  EXPECT_EQ(zero.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(zero.status().message()), HasSubstr("batch.micro_batch_size"));

  EXPECT_EQ(reg.Submit(SubmitJson("{not json"), kT0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(reg.Submit(v1::SubmitJobRequest(), kT0).status().code(),
            absl::StatusCode::kInvalidArgument);

  v1::SubmitJobRequest proto;
  proto.mutable_spec()->mutable_workers()->set_count(0);
  proto.mutable_spec()->mutable_model()->mutable_tiny_gpt();
  proto.mutable_spec()->mutable_data()->mutable_text()->add_paths("/d");
  absl::StatusOr<v1::Job> bad_proto = reg.Submit(proto, kT0);
  EXPECT_EQ(bad_proto.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad_proto.status().message()), HasSubstr("workers.count"));

  EXPECT_TRUE(reg.List().empty());
  EXPECT_TRUE(reg.TakeRecords().empty());
  EXPECT_EQ(reg.Submit(SubmitJson(base), kT0)->job_id(), "job-1");  // no id was used up
}

// Catches: a submitter cancelling another principal's job, the owner lost on replay or
// restore (a restarted coordinator would let anyone cancel it, or no one), and one
// principal's request id (the CLI's default: the spec's hash and the minute) returning
// another principal's job.
TEST(JobRegistryTest, TheOwnerIsRecordedAndLimitsCancelAndRequestIds) {
  JobRegistry reg{MachineOptions{}};
  const Caller alice{"alice", false};
  const Caller bob{"bob", false};
  absl::StatusOr<v1::Job> a = reg.Submit(SubmitWorkers(2, "same-id"), kT0, alice);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->owner(), "alice");
  absl::StatusOr<v1::Job> b = reg.Submit(SubmitWorkers(2, "same-id"), kT0, bob);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_NE(b->job_id(), a->job_id());
  EXPECT_EQ(reg.Submit(SubmitWorkers(2, "same-id"), kT0, alice)->job_id(), a->job_id());

  const std::vector<v1::JournalRecord> records = reg.TakeRecords();
  const v1::CoordinatorSnapshot snapshot = reg.Snapshot();
  std::unique_ptr<JobRegistry> replayed = Replay(records);
  JobRegistry restored{MachineOptions{}};
  restored.Restore(snapshot, kT0);
  for (JobRegistry* r : {&reg, replayed.get(), &restored}) {
    EXPECT_EQ(r->Get(a->job_id())->owner(), "alice");
    EXPECT_EQ(r->Submit(SubmitWorkers(2, "same-id"), kT0, bob)->job_id(), b->job_id());
    absl::StatusOr<v1::Job> refused =
        r->Cancel(CancelRequest(a->job_id()), kT0, Caller{"bob", true});
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied);
    EXPECT_THAT(refused.status().message(),
                HasSubstr("was submitted by \"alice\"; \"bob\" may cancel only its own jobs"));
    EXPECT_EQ(r->Get(a->job_id())->state(), v1::PENDING);
    EXPECT_EQ(r->Cancel(CancelRequest(b->job_id()), kT0, Caller{"bob", true})->state(),
              v1::CANCELLED);
    EXPECT_EQ(r->Cancel(CancelRequest(a->job_id()), kT0, Caller{"root", false})->state(),
              v1::CANCELLED);
  }
}

// Catches: job or worker ids reused after a restart (replay or snapshot).
TEST(JobRegistryTest, IdsSurviveReplayAndRestore) {
  JobRegistry reg{MachineOptions{}};
  ASSERT_EQ(reg.Submit(SubmitWorkers(2), kT0)->job_id(), "job-1");
  ASSERT_EQ(reg.Submit(SubmitWorkers(2), kT0)->job_id(), "job-2");
  ASSERT_EQ(reg.RegisterWorker(Register("job-2"), kT0)->worker_id(), "w-1");
  ASSERT_EQ(reg.RegisterWorker(Register("job-1"), kT0)->worker_id(), "w-2");
  const std::vector<v1::JournalRecord> records = reg.TakeRecords();

  std::unique_ptr<JobRegistry> replayed = Replay(records);
  EXPECT_EQ(replayed->List().size(), 2u);
  EXPECT_EQ(replayed->Get("job-2")->job_id(), "job-2");
  EXPECT_EQ(replayed->ListWorkers("job-2").size(), 1u);

  JobRegistry restored{MachineOptions{}};
  restored.Restore(replayed->Snapshot(), kT0);
  for (JobRegistry* r : {replayed.get(), &restored}) {
    EXPECT_EQ(r->Submit(SubmitWorkers(1), kT0)->job_id(), "job-3");
    EXPECT_EQ(r->RegisterWorker(Register("job-1"), kT0)->worker_id(), "w-3");
  }
  EXPECT_EQ(restored.List()[0].job_id(), "job-1");  // submission order kept
}

// Catches: a worker without a job id sent to a full, ended or younger job, or accepted
// when no job needs workers.
TEST(JobRegistryTest, RegisterWithoutJobPicksOldestJobNeedingWorkers) {
  JobRegistry reg{MachineOptions{}};
  EXPECT_EQ(reg.RegisterWorker(Register(""), kT0).status().code(),
            absl::StatusCode::kFailedPrecondition);
  reg.Submit(SubmitWorkers(1), kT0);  // job-1
  reg.Submit(SubmitWorkers(2), kT0);  // job-2
  reg.Submit(SubmitWorkers(1), kT0);  // job-3
  ASSERT_TRUE(reg.Cancel(CancelRequest("job-3"), kT0).ok());
  EXPECT_EQ(reg.RegisterWorker(Register(""), kT0)->job_id(), "job-1");
  EXPECT_EQ(reg.RegisterWorker(Register(""), kT0)->job_id(), "job-2");
  absl::StatusOr<v1::RegisterWorkerResponse> third = reg.RegisterWorker(Register(""), kT0);
  ASSERT_TRUE(third.ok());
  EXPECT_EQ(third->job_id(), "job-2");
  EXPECT_EQ(third->spec().workers().count(), 2);  // the resolved spec comes back
  EXPECT_EQ(third->lease_ms(), 10000);
  EXPECT_EQ(reg.RegisterWorker(Register(""), kT0).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(reg.RegisterWorker(Register("job-9"), kT0).status().code(),
            absl::StatusCode::kNotFound);

  // job-1's worker is lost: job-1 needs a worker again.
  (*reg.Machine("job-1"))->Tick(kT0 + absl::Minutes(1));
  EXPECT_EQ(reg.RegisterWorker(Register(""), kT0 + absl::Minutes(1))->job_id(), "job-1");
}

// Catches: a retried registration that creates a second worker, here or after a replay.
TEST(JobRegistryTest, RegisterIsIdempotentOnRequestId) {
  JobRegistry reg{MachineOptions{}};
  reg.Submit(SubmitWorkers(2), kT0);
  reg.Submit(SubmitWorkers(2), kT0);
  const std::string w = reg.RegisterWorker(Register("job-2", "pod-a"), kT0)->worker_id();
  absl::StatusOr<v1::RegisterWorkerResponse> again = reg.RegisterWorker(Register("", "pod-a"), kT0);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->worker_id(), w);
  EXPECT_EQ(again->job_id(), "job-2");
  EXPECT_EQ(reg.ListWorkers("job-2").size(), 1u);
  std::unique_ptr<JobRegistry> replayed = Replay(reg.TakeRecords());
  EXPECT_EQ(replayed->RegisterWorker(Register("job-2", "pod-a"), kT0)->worker_id(), w);
  EXPECT_EQ(replayed->ListWorkers("").size(), 1u);
  EXPECT_TRUE(replayed->TakeRecords().empty());
}

// The row of `worker_id` in a listing; fails the test when it is not there.
v1::WorkerInfo Row(const std::vector<v1::WorkerInfo>& rows, const std::string& worker_id) {
  for (const v1::WorkerInfo& w : rows) {
    if (w.worker_id() == worker_id) return w;
  }
  ADD_FAILURE() << "no row for " << worker_id;
  return {};
}

// Catches: a worker that registered again after it was lost (the same pod, its request id
// retried) leaving its old identity listed LOST for ever, with nothing saying what became of
// it. The old row names the new id, in the same job or another, after replay and restore too.
TEST(JobRegistryTest, ReRegisteredLostWorkerMarksItsOldRowReplaced) {
  JobRegistry reg{MachineOptions{}};
  reg.Submit(SubmitWorkers(2), kT0);  // job-1
  reg.Submit(SubmitWorkers(1), kT0);  // job-2
  ASSERT_EQ(reg.RegisterWorker(Register("job-1", "pod-a"), kT0)->worker_id(), "w-1");
  ASSERT_EQ(reg.RegisterWorker(Register("job-1", "pod-b"), kT0)->worker_id(), "w-2");
  const absl::Time lost_at = kT0 + absl::Seconds(11);
  reg.Tick(lost_at);  // both leases ran out
  ASSERT_EQ(reg.RegisterWorker(Register("job-1", "pod-a"), lost_at)->worker_id(), "w-3");
  ASSERT_EQ(reg.RegisterWorker(Register("job-2", "pod-b"), lost_at)->worker_id(), "w-4");
  const std::vector<v1::JournalRecord> records = reg.TakeRecords();
  std::unique_ptr<JobRegistry> replayed = Replay(records);
  JobRegistry restored{MachineOptions{}};
  restored.Restore(reg.Snapshot(), lost_at);
  for (JobRegistry* r : {&reg, replayed.get(), &restored}) {
    const std::vector<v1::WorkerInfo> rows = r->ListWorkers("");
    EXPECT_EQ(Row(rows, "w-1").state(), v1::LOST);
    EXPECT_EQ(Row(rows, "w-1").replaced_by(), "w-3");
    EXPECT_EQ(Row(rows, "w-1").lost_ms(), absl::ToUnixMillis(lost_at));
    EXPECT_EQ(Row(rows, "w-2").replaced_by(), "w-4");  // it came back to job-2
    EXPECT_EQ(Row(rows, "w-3").replaced_by(), "");
    EXPECT_EQ(Row(rows, "w-3").lost_ms(), 0);
  }
}

// Catches: finished rows (a lost or replaced worker, a worker of an ended job) listed for ever.
// They are listed for --finished-worker-retention after they finished (the journaled times),
// then no more; a live job's live worker always.
TEST(JobRegistryTest, FinishedWorkersAreListedForTheRetentionOnly) {
  Limits limits;
  limits.finished_worker_retention = absl::Minutes(10);
  JobRegistry reg{MachineOptions{}, limits};
  reg.Submit(SubmitWorkers(2), kT0);  // job-1
  reg.Submit(SubmitWorkers(1), kT0);  // job-2
  ASSERT_EQ(reg.RegisterWorker(Register("job-1", "pod-a"), kT0)->worker_id(), "w-1");
  ASSERT_EQ(reg.RegisterWorker(Register("job-2"), kT0)->worker_id(), "w-2");
  const absl::Time lost_at = kT0 + absl::Seconds(11);
  reg.Tick(lost_at);
  ASSERT_EQ(reg.RegisterWorker(Register("job-1", "pod-a"), lost_at)->worker_id(), "w-3");
  const absl::Time ended_at = lost_at + absl::Minutes(5);
  ASSERT_TRUE(reg.Cancel(CancelRequest("job-2"), ended_at).ok());
  // w-2 was lost too (at lost_at), before its job ended: its own loss counts.
  ASSERT_TRUE(reg.RegisterWorker(Register("job-1"), ended_at).ok());  // w-4, live
  const auto listed = [&reg](absl::Time now) {
    absl::StatusOr<v1::ListWorkersResponse> page = reg.ListWorkersPage({}, now);
    EXPECT_TRUE(page.ok()) << page.status();
    std::vector<std::string> ids;
    for (const v1::WorkerInfo& w : page->workers()) ids.push_back(w.worker_id());
    return ids;
  };
  using ::testing::ElementsAre;
  EXPECT_THAT(listed(lost_at + absl::Minutes(10) - absl::Milliseconds(1)),
              ElementsAre("w-1", "w-3", "w-4", "w-2"));
  EXPECT_THAT(listed(lost_at + absl::Minutes(10)), ElementsAre("w-3", "w-4"));
  EXPECT_THAT(listed(ended_at + absl::Hours(24)), ElementsAre("w-3", "w-4"));
  EXPECT_EQ(reg.ListWorkers("").size(), 4u);  // a view: the state keeps every row

  // A live worker of a job that ended is listed for the retention after the job's end.
  JobRegistry ended{MachineOptions{}, limits};
  ended.Submit(SubmitWorkers(1), kT0);
  ASSERT_TRUE(ended.RegisterWorker(Register("job-1"), kT0).ok());
  ASSERT_TRUE(ended.Cancel(CancelRequest("job-1"), kT0 + absl::Seconds(1)).ok());
  v1::ListWorkersRequest job_1;
  job_1.set_job_id("job-1");
  EXPECT_EQ(ended.ListWorkersPage(job_1, kT0 + absl::Minutes(10))->workers_size(), 1);
  EXPECT_EQ(ended.ListWorkersPage(job_1, kT0 + absl::Minutes(11))->workers_size(), 0);

  limits.finished_worker_retention = absl::InfiniteDuration();
  JobRegistry forever{MachineOptions{}, limits};
  forever.Restore(reg.Snapshot(), kT0);
  EXPECT_EQ(forever.ListWorkersPage({}, ended_at + absl::Hours(24 * 365))->workers_size(), 4);
}

// Catches: paging that skips or repeats records, or accepts a token it never issued.
TEST(JobRegistryTest, ListUpdatesPaging) {
  SimulatedRanks sim(ResolvedSpec({}));
  sim.Start(2);
  for (int i = 0; i < 5; ++i) sim.RunWindow();
  JobRegistry& reg = sim.registry();
  v1::ListUpdatesRequest req;
  req.set_job_id(sim.job_id());
  req.set_page_size(2);
  std::vector<int64_t> windows;
  std::vector<std::string> tokens;
  for (int page = 0; page < 10; ++page) {
    absl::StatusOr<v1::ListUpdatesResponse> resp = reg.ListUpdates(req);
    ASSERT_TRUE(resp.ok()) << resp.status();
    for (const v1::UpdateRecord& u : resp->updates()) windows.push_back(u.window_id());
    tokens.push_back(resp->next_page_token());
    if (resp->next_page_token().empty()) break;
    req.set_page_token(resp->next_page_token());
  }
  EXPECT_THAT(windows, ::testing::ElementsAre(1, 2, 3, 4, 5));
  EXPECT_EQ(tokens.size(), 3u);

  v1::ListUpdatesRequest all;
  all.set_job_id(sim.job_id());
  EXPECT_EQ(reg.ListUpdates(all)->updates_size(), 5);  // page_size 0: the default
  EXPECT_TRUE(reg.ListUpdates(all)->next_page_token().empty());

  for (const char* bad : {"abc", "-1", "1.5"}) {
    v1::ListUpdatesRequest b = all;
    b.set_page_token(bad);
    absl::StatusOr<v1::ListUpdatesResponse> resp = reg.ListUpdates(b);
    EXPECT_EQ(resp.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  v1::ListUpdatesRequest negative = all;
  negative.set_page_size(-1);
  EXPECT_EQ(reg.ListUpdates(negative).status().code(), absl::StatusCode::kInvalidArgument);
  v1::ListUpdatesRequest unknown;
  unknown.set_job_id("job-404");
  EXPECT_EQ(reg.ListUpdates(unknown).status().code(), absl::StatusCode::kNotFound);
}

// Catches: Get/Cancel of unknown jobs not NOT_FOUND, and a cancel that does not end the job.
TEST(JobRegistryTest, GetAndCancel) {
  JobRegistry reg{MachineOptions{}};
  EXPECT_EQ(reg.Get("job-1").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(reg.Cancel(CancelRequest("job-1"), kT0).status().code(), absl::StatusCode::kNotFound);
  reg.Submit(SubmitWorkers(1), kT0);
  absl::StatusOr<v1::Job> cancelled = reg.Cancel(CancelRequest("job-1"), kT0 + absl::Seconds(2));
  ASSERT_TRUE(cancelled.ok());
  EXPECT_EQ(cancelled->state(), v1::CANCELLED);
  EXPECT_EQ(cancelled->end_time_ms(), absl::ToUnixMillis(kT0 + absl::Seconds(2)));
  EXPECT_EQ(reg.Cancel(CancelRequest("job-1"), kT0).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(reg.Get("job-1")->state(), v1::CANCELLED);
}

// Catches: a journal record routed to the wrong job on replay.
TEST(JobRegistryTest, JobIdOfEveryRecordKind) {
  SimulatedRanks sim(ResolvedSpec(testing_util::SpecOptions{}));
  sim.Start(2);
  sim.RunWindow();
  ASSERT_TRUE(sim.machine().Cancel(sim.now()).ok());
  sim.Drain();
  std::map<int, int> kinds;
  for (const v1::JournalRecord& r : sim.records()) {
    EXPECT_EQ(JobIdOf(r), sim.job_id()) << r.ShortDebugString();
    ++kinds[r.kind_case()];
  }
  EXPECT_GE(kinds.size(), 6u);
  EXPECT_EQ(JobIdOf(v1::JournalRecord()), "");
}

// --- Limits ---

v1::SubmitJobRequest SubmitCheckpointed(const std::string& dir,
                                        const std::string& request_id = "") {
  SpecOptions o;
  o.checkpoint_dir = dir;
  return SubmitJson(SpecJson(o), request_id);
}

// Catches the probe's 3.9 MB request ids and names: refused with INVALID_ARGUMENT naming the
// field, the limit and its flag, on every RPC that carries them; nothing is created.
TEST(JobRegistryTest, OversizedRequestIdNameAndSpecAreRefused) {
  Limits limits;
  limits.max_request_id_bytes = 16;
  limits.max_name_bytes = 16;
  limits.max_spec_bytes = 2048;
  JobRegistry reg{MachineOptions{}, limits};
  absl::Status id = reg.Submit(SubmitWorkers(1, std::string(17, 'r')), kT0).status();
  EXPECT_EQ(id.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(id.message(), "request_id is 17 bytes; the limit is 16 (--max-request-id-bytes)");
  SpecOptions o;
  std::string named = SpecJson(o);
  named.replace(named.find(R"("name":"t")"), 10, R"("name":"a-name-of-20-bytes!")");
  absl::Status name = reg.Submit(SubmitJson(named), kT0).status();
  EXPECT_EQ(name.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(name.message()), HasSubstr("--max-name-bytes"));
  std::string big = SpecJson(o);
  big.replace(big.find(R"(["/data"])"), 9, absl::StrCat(R"([")", std::string(3000, 'p'), R"("])"));
  absl::Status spec = reg.Submit(SubmitJson(big), kT0).status();
  EXPECT_EQ(spec.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(spec.message()), HasSubstr("--max-spec-bytes"));
  EXPECT_TRUE(reg.List().empty());
  EXPECT_TRUE(reg.TakeRecords().empty());

  ASSERT_TRUE(reg.Submit(SubmitWorkers(1), kT0).ok());
  v1::RegisterWorkerRequest w = Register("job-1", std::string(17, 'r'));
  EXPECT_EQ(reg.RegisterWorker(w, kT0).status().code(), absl::StatusCode::kInvalidArgument);
  w = Register("job-1");
  w.set_host(std::string(17, 'h'));
  EXPECT_THAT(std::string(reg.RegisterWorker(w, kT0).status().message()), HasSubstr("host is 17"));
  v1::CancelJobRequest cancel = CancelRequest("job-1");
  cancel.set_request_id(std::string(17, 'r'));
  EXPECT_EQ(reg.Cancel(cancel, kT0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(reg.Get("job-1")->state(), v1::PENDING);
}

// Catches: a worker's megabyte failure message stored whole (it made every job list fail):
// it is truncated, not refused, so the failure still lands.
TEST(JobRegistryTest, FailureMessageIsTruncatedNotRefused) {
  Limits limits;
  limits.max_message_bytes = 300;
  JobRegistry reg{MachineOptions{}, limits};
  ASSERT_TRUE(reg.Submit(SubmitWorkers(1), kT0).ok());
  const std::string worker = reg.RegisterWorker(Register("job-1"), kT0)->worker_id();
  v1::ReportFailureRequest failure;
  failure.set_job_id("job-1");
  failure.set_worker_id(worker);
  failure.set_message(std::string(4 << 20, 'm'));
  ASSERT_TRUE(reg.ReportFailure(failure, kT0).ok());
  const v1::Job job = *reg.Get("job-1");
  EXPECT_EQ(job.state(), v1::FAILED);
  EXPECT_LT(job.message().size(), 400u);
  EXPECT_THAT(job.message(), HasSubstr("truncated from 4194304 bytes"));
}

// Catches: two live jobs sharing a checkpoint dir (they pruned each other's checkpoints).
// The second is refused naming the first, however the path is spelled; once the first ends,
// the directory may be reused (a follow-up job resuming from it); a retry of the first
// request is still answered with the first job, not refused.
TEST(JobRegistryTest, LiveJobsCannotShareACheckpointDir) {
  JobRegistry reg{MachineOptions{}};
  ASSERT_EQ(reg.Submit(SubmitCheckpointed("/ckpt/run", "req-1"), kT0)->job_id(), "job-1");
  EXPECT_EQ(reg.Submit(SubmitCheckpointed("/ckpt/run", "req-1"), kT0)->job_id(), "job-1");
  for (const char* spelling : {"/ckpt/run", "/ckpt/run/", "/ckpt/./x/../run"}) {
    absl::Status s = reg.Submit(SubmitCheckpointed(spelling), kT0).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << spelling;
    EXPECT_THAT(std::string(s.message()), HasSubstr("checkpoint directory of job-1")) << spelling;
  }
  EXPECT_TRUE(reg.Submit(SubmitCheckpointed("/ckpt/other"), kT0).ok());
  ASSERT_TRUE(reg.Cancel(CancelRequest("job-1"), kT0).ok());
  EXPECT_TRUE(reg.Submit(SubmitCheckpointed("/ckpt/run"), kT0).ok());
}

// Catches: unbounded job retention. Beyond --max-jobs the oldest *finished* job is forgotten
// (journaled, so a replay forgets it too, with its request id); when every retained job is
// live, submit is refused with RESOURCE_EXHAUSTED naming the flag.
TEST(JobRegistryTest, MaxJobsForgetsOldestFinishedOrRefuses) {
  Limits limits;
  limits.max_jobs = 3;
  JobRegistry reg{MachineOptions{}, limits};
  for (int i = 1; i <= 3; ++i)
    ASSERT_TRUE(reg.Submit(SubmitWorkers(1, absl::StrCat("r", i)), kT0).ok());
  absl::Status full = reg.Submit(SubmitWorkers(1), kT0).status();
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(full.message()), HasSubstr("--max-jobs"));
  ASSERT_TRUE(reg.RegisterWorker(Register("job-2"), kT0).ok());
  ASSERT_TRUE(reg.Cancel(CancelRequest("job-3"), kT0).ok());
  ASSERT_TRUE(reg.Cancel(CancelRequest("job-2"), kT0).ok());
  ASSERT_EQ(reg.Submit(SubmitWorkers(1), kT0)->job_id(), "job-4");  // forgets job-2, not job-1
  std::vector<std::string> ids;
  for (const v1::Job& j : reg.List()) ids.push_back(j.job_id());
  EXPECT_EQ(ids, (std::vector<std::string>{"job-1", "job-3", "job-4"}));
  EXPECT_EQ(reg.Get("job-2").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(reg.ListWorkers("").empty());  // job-2's worker went with it
  // Its request id is free again; the live job's is not.
  EXPECT_EQ(reg.Submit(SubmitWorkers(1, "r1"), kT0)->job_id(), "job-1");

  std::unique_ptr<JobRegistry> replayed = Replay(reg.TakeRecords());
  std::vector<std::string> replayed_ids;
  for (const v1::Job& j : replayed->List()) replayed_ids.push_back(j.job_id());
  EXPECT_EQ(replayed_ids, ids);
  EXPECT_EQ(replayed->Submit(SubmitWorkers(1), kT0)->job_id(), "job-5");  // ids never reused
}

// Catches: a journal written under higher limits that no longer replays (or replays
// differently) after the limits are lowered: it replays in full, and only then are the
// oldest finished jobs beyond the new --max-jobs forgotten, journaled for the next replay.
TEST(JobRegistryTest, JournalFromHigherLimitsReplaysUnderLowerOnes) {
  Limits high;
  high.max_request_id_bytes = 8 << 20;
  JobRegistry before{MachineOptions{}, high};
  for (int i = 1; i <= 4; ++i) {
    ASSERT_TRUE(before.Submit(SubmitWorkers(1, std::string(1 << 20, 'a' + i)), kT0).ok());
  }
  ASSERT_TRUE(before.Cancel(CancelRequest("job-1"), kT0).ok());
  ASSERT_TRUE(before.Cancel(CancelRequest("job-2"), kT0).ok());
  const std::vector<v1::JournalRecord> records = before.TakeRecords();

  Limits low;
  low.max_jobs = 2;
  low.list_page_bytes = (1 << 20) + 4096;  // one job with its 1 MiB request id per page
  JobRegistry after{MachineOptions{}, low};
  for (const v1::JournalRecord& r : records) {
    const absl::Status applied = after.Apply(r);
    ASSERT_TRUE(applied.ok()) << applied;
  }
  EXPECT_EQ(after.List().size(), 4u);
  after.Recovered(kT0);
  std::vector<std::string> ids;
  for (const v1::Job& j : after.List()) ids.push_back(j.job_id());
  EXPECT_EQ(ids, (std::vector<std::string>{"job-3", "job-4"}));  // both live: kept
  const std::vector<v1::JournalRecord> forgotten = after.TakeRecords();
  ASSERT_EQ(forgotten.size(), 2u);
  EXPECT_EQ(forgotten[0].job_forgotten().job_id(), "job-1");

  std::vector<v1::JournalRecord> all = records;
  all.insert(all.end(), forgotten.begin(), forgotten.end());
  EXPECT_EQ(Replay(all)->List().size(), 2u);

  // Listing pages by bytes: each page fits its budget, and following tokens sees them all.
  v1::ListJobsRequest req;
  std::vector<std::string> listed;
  for (int pages = 0; pages < 10; ++pages) {
    absl::StatusOr<v1::ListJobsResponse> page = after.ListJobs(req);
    ASSERT_TRUE(page.ok()) << page.status();
    EXPECT_EQ(page->jobs_size(), 1);
    EXPECT_LE(static_cast<int64_t>(page->ByteSizeLong()), low.list_page_bytes + 64);
    for (const v1::Job& j : page->jobs()) listed.push_back(j.job_id());
    if (page->next_page_token().empty()) break;
    req.set_page_token(page->next_page_token());
  }
  EXPECT_EQ(listed, ids);
}

// Catches: a job page that ignores page_size, or whose token shifts when a job before it is
// forgotten between two pages (the token is a job number, not a position).
TEST(JobRegistryTest, ListJobsPagesBySizeAndSurvivesForgetting) {
  Limits limits;
  limits.max_jobs = 5;
  JobRegistry reg{MachineOptions{}, limits};
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(reg.Submit(SubmitWorkers(1), kT0).ok());
  v1::ListJobsRequest req;
  req.set_page_size(2);
  absl::StatusOr<v1::ListJobsResponse> first = reg.ListJobs(req);
  ASSERT_TRUE(first.ok());
  ASSERT_EQ(first->jobs_size(), 2);
  EXPECT_EQ(first->next_page_token(), "2");
  ASSERT_TRUE(reg.Cancel(CancelRequest("job-1"), kT0).ok());
  ASSERT_TRUE(reg.Submit(SubmitWorkers(1), kT0).ok());  // forgets job-1
  req.set_page_token(first->next_page_token());
  absl::StatusOr<v1::ListJobsResponse> second = reg.ListJobs(req);
  ASSERT_TRUE(second.ok());
  ASSERT_EQ(second->jobs_size(), 2);
  EXPECT_EQ(second->jobs(0).job_id(), "job-3");
  req.set_page_token("bogus");
  EXPECT_EQ(reg.ListJobs(req).status().code(), absl::StatusCode::kInvalidArgument);
}

// Catches: the earliest lease of all jobs not being the registry's next deadline.
TEST(JobRegistryTest, NextDeadlineIsEarliestOfAllJobs) {
  JobRegistry reg{MachineOptions{}};
  EXPECT_FALSE(reg.NextDeadline().has_value());
  reg.Submit(SubmitWorkers(1), kT0);
  reg.Submit(SubmitWorkers(1), kT0);
  reg.RegisterWorker(Register("job-2"), kT0 + absl::Seconds(3));
  reg.RegisterWorker(Register("job-1"), kT0 + absl::Seconds(5));
  EXPECT_EQ(reg.NextDeadline(), kT0 + absl::Seconds(13));
  reg.Tick(kT0 + absl::Seconds(14));
  EXPECT_EQ(reg.ListWorkers("job-2")[0].state(), v1::LOST);
  EXPECT_EQ(reg.ListWorkers("job-1")[0].state(), v1::REGISTERED);
  EXPECT_EQ(reg.NextDeadline(), kT0 + absl::Seconds(15));
}

// ---------------------------------------------------------------------------------------
// Journal replay equivalence

// Fields that are not journaled on purpose (DESIGN: leases are rebuilt by the workers).
void ClearEphemeral(v1::CoordinatorSnapshot* s) {
  for (v1::JobSnapshot& job : *s->mutable_jobs()) {
    for (v1::WorkerSnapshot& w : *job.mutable_workers())
      w.mutable_info()->clear_last_heartbeat_ms();
  }
}

void ExpectSameSnapshot(const v1::CoordinatorSnapshot& actual,
                        const v1::CoordinatorSnapshot& expected, const std::string& what) {
  if (actual.SerializeAsString() == expected.SerializeAsString()) return;
  std::string diff;
  MessageDifferencer d;
  d.ReportDifferencesToString(&diff);
  d.Compare(expected, actual);
  ADD_FAILURE() << what << " differs:\n" << diff;
}

class ReplayChecker {
 public:
  explicit ReplayChecker(SimulatedRanks* sim) : sim_(sim), replica_(sim->options()) {}

  // Feeds the new records to the replica, then compares live, replayed and restored states.
  void Check(const std::string& step) {
    SCOPED_TRACE(step);
    for (; applied_ < sim_->records().size(); ++applied_) {
      // Every record the live machine emitted follows from the state before it.
      const absl::Status applied = replica_.Apply(sim_->records()[applied_]);
      ASSERT_TRUE(applied.ok()) << applied;
    }
    v1::CoordinatorSnapshot live = sim_->registry().Snapshot();
    v1::CoordinatorSnapshot replayed = replica_.Snapshot();
    JobRegistry restored(sim_->options());
    restored.Restore(replayed, sim_->now());
    ExpectSameSnapshot(restored.Snapshot(), replayed, "Restore(replayed.Snapshot())");
    JobRegistry restored_live(sim_->options());
    restored_live.Restore(live, sim_->now());
    ExpectSameSnapshot(restored_live.Snapshot(), live, "Restore(live.Snapshot())");
    ClearEphemeral(&live);
    ClearEphemeral(&replayed);
    ExpectSameSnapshot(replayed, live, "replayed vs live");
    ++checks_;
  }
  int checks() const { return checks_; }

 private:
  SimulatedRanks* sim_;
  JobRegistry replica_;
  size_t applied_ = 0;
  int checks_ = 0;
};

bool GenerationLive(SimulatedRanks& sim) {
  const std::vector<std::string> ranks = sim.Ranks();
  if (ranks.empty()) return false;
  absl::StatusOr<v1::HeartbeatResponse> hb = sim.Heartbeat(ranks[0]);
  return hb.ok() && hb->assigned();
}

void EnsureGeneration(SimulatedRanks& sim) {
  for (int i = 0; i < 4 && !GenerationLive(sim); ++i) {
    const std::string w = sim.AddWorker();
    EXPECT_TRUE(sim.Heartbeat(w).ok());
  }
  ASSERT_TRUE(GenerationLive(sim));
}

// Catches: any state change made outside Apply (live and replayed coordinators would
// diverge after a restart), and any state Snapshot/Restore loses — checked after every
// step of a long scenario with commits, skips, aborts, lost workers, rollbacks and
// checkpoints, on two jobs.
TEST(JournalReplayTest, ReplayAndRestoreEqualLiveAtEveryStep) {
  SpecOptions o;
  o.precision = "fp16";
  o.loss_scaler = R"({"init_scale":1024,"growth_interval":3,"hysteresis":2})";
  o.checkpoint_dir = "/ckpt";
  o.every_updates = 2;
  o.max_grad_norm = 1.0;
  o.max_updates = 1000;
  o.schedule = R"({"warmup_cosine":{"warmup_updates":3,"total_updates":40,"min_lr_ratio":0.1}})";
  SimulatedRanks sim(ResolvedSpec(o));
  ReplayChecker checker(&sim);
  checker.Check("submitted");
  {  // a second job, never started, shares the registry
    v1::SubmitJobRequest other;
    *other.mutable_spec() = ResolvedSpec({});
    other.set_request_id("other");
    ASSERT_TRUE(sim.registry().Submit(other, sim.now()).ok());
    sim.Drain();
  }
  sim.Start(2);
  checker.Check("started");
  ASSERT_TRUE(sim.Ack(0, 0).ok());
  checker.Check("ack 0");

  std::mt19937 rng(20240607);
  auto uniform = [&rng](int n) { return static_cast<int>(rng() % n); };
  std::vector<std::pair<int64_t, int64_t>> to_ack;  // (checkpoint, update)
  int desync_streak = 0;
  std::map<std::string, int> seen;
  auto note = [&](const v1::WindowDecision& d) {
    if (d.write_checkpoint()) to_ack.emplace_back(d.checkpoint_id(), d.optimizer_update_id());
    if (d.outcome() != v1::ABORT) desync_streak = 0;
    ++seen[d.record().outcome() + "/" + d.record().reason()];
  };
  auto random_reports = [&](int world) {
    std::vector<RankReport> reports;
    const double norm = 0.1 + uniform(300) / 100.0;
    for (int r = 0; r < world; ++r) {
      RankReport rep;
      rep.units = 1 + uniform(50);
      rep.loss_sum = rep.units * (0.5 + uniform(100) / 100.0);
      rep.grad_norm = norm;
      rep.micro_steps = 2;
      reports.push_back(rep);
    }
    return reports;
  };

  for (int step = 0; step < 120 && sim.state() == v1::RUNNING; ++step) {
    sim.Advance(absl::Milliseconds(1 + uniform(500)));
    EnsureGeneration(sim);
    const int world = static_cast<int>(sim.Ranks().size());
    std::vector<RankReport> reports = random_reports(world);
    const int pick = uniform(100);
    std::string what;
    if (pick < 40) {
      what = "commit";
      note(sim.RunWindow(reports));
    } else if (pick < 50) {
      what = "overflow";
      for (RankReport& r : reports) r.found_inf = true;
      note(sim.RunWindow(reports));
    } else if (pick < 54) {
      what = "nonfinite loss";
      reports[0].loss_sum = std::numeric_limits<double>::quiet_NaN();
      note(sim.RunWindow(reports));
    } else if (pick < 59) {
      what = "empty";
      const int64_t w = sim.next_window();
      sim.BeginAll(w, std::vector<int64_t>(world, 0));
      auto a = sim.Begin(0, w, 0);
      ASSERT_TRUE(a.ok() && a->ready);
      note(a->response.decision());
    } else if (pick < 66 && desync_streak < 2) {
      what = "desync";
      reports[world - 1].grad_norm *= 2;
      ++desync_streak;
      note(sim.RunWindow(reports));
    } else if (pick < 76) {
      what = "worker lost mid-window";
      const int64_t w = sim.next_window();
      std::vector<int64_t> units;
      for (const RankReport& r : reports) units.push_back(r.units);
      sim.BeginAll(w, units);
      sim.Complete(0, w, reports[0]);
      const std::string standby = sim.AddWorker();
      ASSERT_TRUE(sim.Heartbeat(standby).ok());
      checker.Check(absl::StrCat("step ", step, " standby joined"));
      sim.Lose({sim.Ranks().back()});
    } else if (pick < 81) {
      what = "all workers lost";
      sim.Lose(sim.Ranks());
      checker.Check(absl::StrCat("step ", step, " all lost"));
      EnsureGeneration(sim);
    } else if (pick < 88) {
      what = "prefetch";
      const int64_t w = sim.next_window();
      std::vector<int64_t> units;
      for (const RankReport& r : reports) units.push_back(r.units);
      sim.BeginAll(w, units);
      for (int r = 0; r < world; ++r) {
        auto a = sim.Begin(r, w + 1, 5);
        ASSERT_TRUE(a.ok() && !a->ready);
      }
      note(sim.CompleteAll(w, reports));
      checker.Check(absl::StrCat("step ", step, " prefetched"));
      std::vector<RankReport> next = random_reports(world);
      for (RankReport& r : next) r.units = 5;
      note(sim.CompleteAll(w + 1, next));
    } else {
      what = "ack";
      while (!to_ack.empty()) {
        const auto [id, update] = to_ack.back();
        to_ack.pop_back();
        (void)sim.Ack(id, update);  // NOT_FOUND after a rollback is fine
      }
    }
    if (!to_ack.empty() && uniform(2) == 0) {
      (void)sim.Ack(to_ack.back().first, to_ack.back().second);
      to_ack.pop_back();
    }
    checker.Check(absl::StrCat("step ", step, ": ", what));
    if (HasFailure()) return;
  }
  ASSERT_TRUE(sim.machine().Cancel(sim.now()).ok());
  sim.Drain();
  checker.Check("cancelled");

  // The scenario must keep exercising every kind of record and decision.
  std::map<int, int> kinds;
  bool rolled_back = false;
  for (const v1::JournalRecord& r : sim.records()) {
    ++kinds[r.kind_case()];
    if (r.has_generation_formed() && r.generation_formed().rolled_back()) rolled_back = true;
  }
  EXPECT_EQ(kinds.size(), 8u);
  EXPECT_TRUE(rolled_back);
  for (const char* k :
       {"commit/", "skip/OVERFLOW", "skip/EMPTY_WINDOW", "skip/NONFINITE_LOSS", "abort/DESYNC"}) {
    EXPECT_GT(seen[k], 0) << k;
  }
  int lost_aborts = 0;
  for (const v1::UpdateRecord& u : sim.machine().updates())
    lost_aborts += u.reason() == "WORKER_LOST";
  EXPECT_GT(lost_aborts, 0);
  EXPECT_GT(sim.progress().optimizer_update_id(), 5);
  EXPECT_GT(checker.checks(), 100);
}

// Catches: the log-contract fields derived from decisions (micro-step id, the update
// interval's origin, dropped tails in the job's progress) rebuilt differently by a replayed
// or restored coordinator, or not rolled back with the ids when every replica is lost.
TEST(JournalReplayTest, LogContractFieldsSurviveReplayRestoreAndRollback) {
  SpecOptions o = {};
  o.tail = "drop";
  o.epochs = 4;
  o.checkpoint_dir = "/ckpt";
  o.every_updates = 2;
  o.precision = "fp16";
  o.loss_scaler = R"({"init_scale":1024})";
  SimulatedRanks sim(ResolvedSpec(o));
  sim.set_samples(10);  // B = 4: 2 windows per epoch, positions 8 and 9 dropped
  ReplayChecker checker(&sim);
  sim.Start(2);
  ASSERT_TRUE(sim.Ack(0, 0).ok());
  checker.Check("started");
  int64_t last_commit_ms = 0;
  for (int64_t w = 1; w <= 4; ++w) {
    sim.Advance(absl::Milliseconds(250 * w));
    const v1::WindowDecision d = sim.RunWindow();
    ASSERT_EQ(d.outcome(), v1::COMMIT);
    last_commit_ms = d.record().end_time_ms();
    if (w == 2) ASSERT_TRUE(sim.Ack(d.checkpoint_id(), 2).ok());
    checker.Check(absl::StrCat("window ", w));
  }
  EXPECT_EQ(sim.progress().micro_step_id(), 16);
  EXPECT_EQ(sim.progress().dropped_samples(), 4);
  EXPECT_EQ(sim.progress().last_dropped_tail().epoch(), 1);

  sim.Lose(sim.Ranks());  // the checkpoint of update 4 was never acknowledged: back to 2
  checker.Check("all lost");
  EnsureGeneration(sim);
  checker.Check("rolled back");
  const v1::JobProgress p = sim.progress();
  EXPECT_EQ(p.window_id(), 2);
  EXPECT_EQ(p.micro_step_id(), 8);
  EXPECT_EQ(p.dropped_samples(), 2);
  EXPECT_EQ(p.last_dropped_tail().epoch(), 0);
  sim.Advance(absl::Seconds(3));
  const v1::UpdateRecord r = sim.RunWindow().record();
  EXPECT_EQ(r.window_id(), 3);
  EXPECT_EQ(r.micro_step_id(), 12);
  EXPECT_DOUBLE_EQ(r.update_interval_seconds(),
                   static_cast<double>(r.end_time_ms() - last_commit_ms) / 1000.0);
  checker.Check("window 3 again");
}

// Catches: a restarted coordinator that replays a damaged (or forged) journal whose records
// pass their checksums but cannot follow one another, and runs the job from a state no run
// reaches (the journal_replay fuzzer's findings: a window committed before any generation, a
// generation naming one worker twice). Replay must stop with DATA_LOSS naming the record.
TEST(JournalReplayTest, RecordsThatCannotFollowTheirPredecessorsAreRefused) {
  SimulatedRanks sim(ResolvedSpec({}));
  const std::vector<std::string> workers = sim.Start(2);
  sim.RunWindow();
  sim.RunWindow();
  const std::vector<v1::JournalRecord> journal = sim.records();
  auto first_of = [&journal](v1::JournalRecord::KindCase kind) {
    for (size_t i = 0; i < journal.size(); ++i) {
      if (journal[i].kind_case() == kind) return i;
    }
    ADD_FAILURE() << "no record of kind " << kind;
    return journal.size();
  };
  const size_t formed = first_of(v1::JournalRecord::kGenerationFormed);
  const size_t ended = first_of(v1::JournalRecord::kWindowEnded);
  ASSERT_LT(formed, ended);
  const size_t second_worker = first_of(v1::JournalRecord::kWorkerRegistered) + 1;
  ASSERT_TRUE(journal[second_worker].has_worker_registered());

  struct Damage {
    std::string what;
    std::function<void(std::vector<v1::JournalRecord>*)> apply;
    size_t record;  // the index of the record replay must refuse
    std::string reason;
  };
  const std::vector<Damage> damages = {
      {"a window ended before any generation", [&](auto* j) { j->erase(j->begin() + formed); },
       ended - 1, "generation 1 while the job is in generation 0"},
      {"a generation naming one worker twice",
       [&](auto* j) { (*j)[formed].mutable_generation_formed()->set_worker_ids(1, workers[0]); },
       formed, "twice"},
      {"a generation naming a worker the job does not have",
       [&](auto* j) { (*j)[formed].mutable_generation_formed()->set_worker_ids(1, "w-99"); },
       formed, "does not have"},
      {"a generation skipping a number",
       [&](auto* j) { (*j)[formed].mutable_generation_formed()->set_generation(2); }, formed,
       "forms generation 2 after generation 0"},
      {"a record for a job the journal does not hold",
       [&](auto* j) { (*j)[ended].mutable_window_ended()->set_job_id("job-99"); }, ended, "job-99"},
      {"a window ended twice", [&](auto* j) { j->insert(j->begin() + ended + 1, (*j)[ended]); },
       ended + 1, "ends window 1 after window 1"},
      {"a commit that skips an optimizer update",
       [&](auto* j) {
         (*j)[ended].mutable_window_ended()->mutable_decision()->set_optimizer_update_id(2);
       },
       ended, "leaves optimizer update 2"},
      {"a job submitted twice", [&](auto* j) { j->insert(j->begin() + 1, (*j)[0]); }, 1,
       "already submitted"},
      {"a registration replacing a worker that is not lost",
       [&](auto* j) { (*j)[second_worker].mutable_worker_registered()->set_replaces(workers[0]); },
       second_worker, "which is not a lost worker of any job"},
  };
  for (const Damage& damage : damages) {
    SCOPED_TRACE(damage.what);
    std::vector<v1::JournalRecord> damaged = journal;
    damage.apply(&damaged);
    RecoveredJournal recovered;
    for (const v1::JournalRecord& r : damaged) recovered.records.push_back(r.SerializeAsString());
    JobRegistry registry{MachineOptions{}};
    const absl::Status s = ReplayJournal(recovered, "/state", sim.now(), &registry);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
    EXPECT_THAT(std::string(s.message()),
                ::testing::HasSubstr(absl::StrCat("journal record ", damage.record + 1,
                                                  " in /state cannot follow")));
    EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr(damage.reason));
  }
  // And the undamaged journal replays.
  RecoveredJournal intact;
  for (const v1::JournalRecord& r : journal) intact.records.push_back(r.SerializeAsString());
  JobRegistry registry{MachineOptions{}};
  EXPECT_TRUE(ReplayJournal(intact, "/state", sim.now(), &registry).ok());
}

}  // namespace
}  // namespace trainstep
