// The worker's control flow against a scripted coordinator: registration, the one heartbeat
// source, what its answers mean for the training thread's waits, and Classify. No server, no
// LibTorch; heartbeats run every millisecond and every wait is bounded.
#include "worker/link/coordinator_link.h"

#include <algorithm>
#include <atomic>
#include <deque>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/clock.h"
#include "gtest/gtest.h"

namespace trainstep {
namespace {

// Answers RegisterWorker with w1, w2, ... and every Heartbeat with what the test scripted
// last (or the next queued one-off answer), recording the requests.
class FakeControlClient : public WorkerControlClient {
 public:
  absl::StatusOr<v1::RegisterWorkerResponse> RegisterWorker(
      const v1::RegisterWorkerRequest& req) override {
    absl::MutexLock lock(&mu_);
    registrations_.push_back(req);
    if (!register_error_.ok()) return register_error_;
    v1::RegisterWorkerResponse r;
    r.set_job_id(req.job_id().empty() ? "job-1" : req.job_id());
    r.set_worker_id(absl::StrCat("w", registrations_.size()));
    r.set_heartbeat_interval_ms(heartbeat_interval_ms_);
    r.mutable_spec()->set_name("spec-name");
    return r;
  }
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& req) override {
    absl::MutexLock lock(&mu_);
    heartbeats_.push_back(req);
    if (!once_.empty()) {
      absl::StatusOr<v1::HeartbeatResponse> r = once_.front();
      once_.pop_front();
      return r;
    }
    return answer_;
  }
  absl::Status ReportFailure(const v1::ReportFailureRequest& req) override {
    absl::MutexLock lock(&mu_);
    failures_.push_back(req);
    return absl::OkStatus();
  }

  // A stream whose pushes and end the test decides (EnableAttach); UNIMPLEMENTED otherwise, as
  // an older coordinator answers.
  absl::Status Attach(const v1::AttachRequest& req,
                      const std::function<void(const v1::HeartbeatResponse&)>& on_place,
                      CallCanceller* canceller) override {
    {
      absl::MutexLock lock(&mu_);
      if (!attach_enabled_) return absl::UnimplementedError("Attach");
      attaches_.push_back(req);
    }
    if (!canceller->Enter([this] {
          absl::MutexLock lock(&mu_);
          stream_cancelled_ = true;
          stream_cv_.SignalAll();
        })) {
      return absl::CancelledError("stopping");
    }
    absl::Status ended;
    while (true) {
      v1::HeartbeatResponse next;
      {
        absl::MutexLock lock(&mu_);
        while (pushes_.empty() && !stream_end_.has_value() && !stream_cancelled_) {
          stream_cv_.Wait(&mu_);
        }
        if (stream_cancelled_) {
          ended = absl::CancelledError("cancelled");
          break;
        }
        if (pushes_.empty()) {
          ended = *stream_end_;
          stream_end_.reset();
          break;
        }
        next = pushes_.front();
        pushes_.pop_front();
      }
      on_place(next);
    }
    canceller->Leave();
    return ended;
  }
  // 1 by default: clamped to 50 ms by the link; urgent waits go faster.
  void SetHeartbeatInterval(int64_t ms) {
    absl::MutexLock lock(&mu_);
    heartbeat_interval_ms_ = ms;
  }
  void EnableAttach() {
    absl::MutexLock lock(&mu_);
    attach_enabled_ = true;
  }
  void Push(const v1::HeartbeatResponse& place) {
    absl::MutexLock lock(&mu_);
    pushes_.push_back(place);
    stream_cv_.SignalAll();
  }
  void EndStream(absl::Status s) {
    absl::MutexLock lock(&mu_);
    stream_end_ = std::move(s);
    stream_cv_.SignalAll();
  }
  size_t attaches() const {
    absl::MutexLock lock(&mu_);
    return attaches_.size();
  }

  void Answer(absl::StatusOr<v1::HeartbeatResponse> r) {
    absl::MutexLock lock(&mu_);
    answer_ = std::move(r);
  }
  void AnswerOnce(absl::StatusOr<v1::HeartbeatResponse> r) {
    absl::MutexLock lock(&mu_);
    once_.push_back(std::move(r));
  }
  void FailRegistration(absl::Status s) {
    absl::MutexLock lock(&mu_);
    register_error_ = std::move(s);
  }
  std::vector<v1::HeartbeatRequest> heartbeats() const {
    absl::MutexLock lock(&mu_);
    return heartbeats_;
  }
  size_t registrations() const {
    absl::MutexLock lock(&mu_);
    return registrations_.size();
  }
  std::vector<v1::ReportFailureRequest> failures() const {
    absl::MutexLock lock(&mu_);
    return failures_;
  }

 private:
  mutable absl::Mutex mu_;
  absl::StatusOr<v1::HeartbeatResponse> answer_ = v1::HeartbeatResponse();
  std::deque<absl::StatusOr<v1::HeartbeatResponse>> once_;
  absl::Status register_error_;
  std::vector<v1::RegisterWorkerRequest> registrations_;
  std::vector<v1::HeartbeatRequest> heartbeats_;
  std::vector<v1::ReportFailureRequest> failures_;
  int64_t heartbeat_interval_ms_ = 1;
  bool attach_enabled_ = false;
  absl::CondVar stream_cv_;
  std::deque<v1::HeartbeatResponse> pushes_;
  std::optional<absl::Status> stream_end_;
  bool stream_cancelled_ = false;
  std::vector<v1::AttachRequest> attaches_;
};

v1::HeartbeatResponse Assigned(int64_t generation) {
  v1::HeartbeatResponse r;
  r.set_job_state(v1::RUNNING);
  r.set_assigned(true);
  r.mutable_assignment()->set_generation(generation);
  r.mutable_assignment()->set_world_size(1);
  return r;
}

v1::HeartbeatResponse Ended(v1::JobState state, const std::string& message) {
  v1::HeartbeatResponse r;
  r.set_job_state(state);
  r.set_job_message(message);
  return r;
}

class CoordinatorLinkTest : public ::testing::Test {
 protected:
  CoordinatorLinkTest() { MakeLink(absl::Milliseconds(1)); }
  // `urgent_every`: the heartbeats' pace while a wait needs them.
  void MakeLink(absl::Duration urgent_every) {
    LinkOptions o;
    o.name = "test-worker";
    o.host = "127.0.0.1";
    o.coordinator = "127.0.0.1:1";
    o.clock = &clock_;
    o.urgent_every = urgent_every;
    link_ = std::make_unique<CoordinatorLink>(&client_, o);
  }
  void Start() {
    ASSERT_TRUE(link_->Register().ok());
    link_->StartHeartbeats();
  }

  FakeClock clock_;
  FakeControlClient client_;
  std::unique_ptr<CoordinatorLink> link_;
};

// Catches: an error meaning decided differently in different places (NOT_FOUND from a
// report once failed the job while the same code from a heartbeat rejoined).
TEST(ClassifyTest, WhatEachCodeMeans) {
  EXPECT_EQ(Classify(absl::UnavailableError("coordinator restarting")), ErrorMeaning::kRejoin);
  EXPECT_EQ(Classify(absl::AbortedError("stale generation")), ErrorMeaning::kRejoin);
  EXPECT_EQ(Classify(absl::DeadlineExceededError("barrier")), ErrorMeaning::kRejoin);
  EXPECT_EQ(Classify(absl::NotFoundError("declared lost")), ErrorMeaning::kRejoin);
  EXPECT_EQ(Classify(absl::InvalidArgumentError("bad report")), ErrorMeaning::kFatal);
  EXPECT_EQ(Classify(absl::PermissionDeniedError("role")), ErrorMeaning::kFatal);
  EXPECT_EQ(Classify(absl::InternalError("torch")), ErrorMeaning::kFatal);
}

// Catches: the job and spec of the registration answer not kept.
TEST_F(CoordinatorLinkTest, RegisterLearnsTheJob) {
  ASSERT_TRUE(link_->Register().ok());
  EXPECT_EQ(link_->job_id(), "job-1");
  EXPECT_EQ(link_->spec().name(), "spec-name");
  EXPECT_EQ(link_->worker_id(), "w1");
}

// Catches: a registration failure without the coordinator's address in the message.
TEST_F(CoordinatorLinkTest, RegisterFailureNamesTheCoordinator) {
  client_.FailRegistration(absl::UnavailableError("connection refused"));
  const absl::Status s = link_->Register();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(s.message().find("127.0.0.1:1"), absl::string_view::npos) << s.message();
}

// Catches: an assignment from before the call taken as the next one (a worker rejoining
// the generation that just broke).
TEST_F(CoordinatorLinkTest, AwaitAssignmentTakesOnlyALaterGeneration) {
  client_.Answer(Assigned(1));
  Start();
  absl::StatusOr<v1::Assignment> a = link_->AwaitAssignment(0);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->generation(), 1);
  EXPECT_EQ(link_->member_id(), "w1");
  EXPECT_TRUE(link_->KeepWaiting());

  // Generation 1 broke; the coordinator still says 1 for a while, then 2.
  client_.AnswerOnce(Assigned(1));
  client_.AnswerOnce(Assigned(1));
  client_.Answer(Assigned(2));
  a = link_->AwaitAssignment(1);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->generation(), 2);
}

// Catches: barrier waits that go on after the generation this worker joined was replaced
// or after the job ended (the worker would sit in a dead barrier until its deadline).
TEST_F(CoordinatorLinkTest, KeepWaitingStopsWhenSupersededOrOver) {
  client_.Answer(Assigned(3));
  Start();
  ASSERT_TRUE(link_->AwaitAssignment(0).ok());
  EXPECT_TRUE(link_->KeepWaiting());
  v1::HeartbeatResponse none;  // re-formed without us
  none.set_job_state(v1::RUNNING);
  client_.Answer(none);
  // Bounded: the next few heartbeats say so.
  for (int i = 0; i < 2000 && link_->KeepWaiting(); ++i) absl::SleepFor(absl::Milliseconds(1));
  EXPECT_FALSE(link_->KeepWaiting());
  EXPECT_EQ(link_->Snapshot().current_generation, -1);
}

// Catches: a worker that keeps waiting for an assignment after its job ended.
TEST_F(CoordinatorLinkTest, AwaitAssignmentEndsWithTheJob) {
  client_.Answer(Ended(v1::CANCELLED, "by user"));
  Start();
  absl::StatusOr<v1::Assignment> a = link_->AwaitAssignment(0);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(a.status().message(), "job CANCELLED: by user");
  EXPECT_TRUE(link_->Snapshot().job_over);
}

// Catches: a heartbeat error that can never heal (a wrong credential, a bad request) retried
// forever instead of failing the worker with it.
TEST_F(CoordinatorLinkTest, FatalHeartbeatErrorEndsTheWait) {
  client_.Answer(absl::PermissionDeniedError("role viewer may not heartbeat"));
  Start();
  absl::StatusOr<v1::Assignment> a = link_->AwaitAssignment(0);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kPermissionDenied);
}

// Catches: a worker declared lost that never comes back: it must register again under a new
// identity, report its dataset to that identity, and take an assignment given to it.
TEST_F(CoordinatorLinkTest, DeclaredLostRegistersAgainAndReportsTheDataset) {
  v1::DatasetInfo data;
  data.set_samples(10);
  data.set_fingerprint("fp");
  link_->SetDataset(data);
  client_.AnswerOnce(absl::NotFoundError("worker w1 was declared lost"));
  client_.Answer(Assigned(4));
  Start();
  absl::StatusOr<v1::Assignment> a = link_->AwaitAssignment(0);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(client_.registrations(), 2u);
  EXPECT_EQ(link_->worker_id(), "w2");
  EXPECT_EQ(link_->member_id(), "w2");  // the assignment is the new identity's
  bool reported_to_new = false;
  for (const v1::HeartbeatRequest& h : client_.heartbeats()) {
    if (h.worker_id() == "w2" && h.dataset().fingerprint() == "fp") reported_to_new = true;
  }
  EXPECT_TRUE(reported_to_new);
}

// Catches: a worker whose dataset the coordinator refused waiting forever for an assignment.
TEST_F(CoordinatorLinkTest, RefusedDatasetFailsTheWait) {
  client_.Answer(absl::FailedPreconditionError("dataset fingerprint differs"));
  Start();
  absl::StatusOr<v1::Assignment> a = link_->AwaitAssignment(0);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(a.status().message(), "dataset fingerprint differs");
  EXPECT_FALSE(link_->KeepWaiting());
}

// Catches: the applied update not carried by the heartbeats (the coordinator picks the
// broadcast source from it).
TEST_F(CoordinatorLinkTest, HeartbeatsCarryTheAppliedUpdate) {
  client_.Answer(Assigned(1));
  link_->SetAppliedUpdate(17);
  Start();
  ASSERT_TRUE(link_->AwaitAssignment(0).ok());
  ASSERT_FALSE(client_.heartbeats().empty());
  EXPECT_EQ(client_.heartbeats().back().applied_update_id(), 17);
  EXPECT_EQ(client_.heartbeats().back().job_id(), "job-1");
}

// Catches: AwaitJobEnd returning before the job ended, or never giving up (it runs on the
// injected clock).
TEST_F(CoordinatorLinkTest, AwaitJobEndWaitsForTheEndOrGivesUp) {
  client_.Answer(Assigned(1));
  Start();
  std::atomic<bool> done{false};
  absl::Status result;
  std::thread waiter([&] {
    result = link_->AwaitJobEnd(absl::Minutes(30));
    done = true;
  });
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_FALSE(done);
  clock_.Advance(absl::Minutes(31));
  waiter.join();
  EXPECT_EQ(result.code(), absl::StatusCode::kDeadlineExceeded);

  client_.Answer(Ended(v1::SUCCEEDED, ""));
  EXPECT_TRUE(link_->AwaitJobEnd(absl::Minutes(30)).ok());
}

// Catches: the heartbeats not saying that the worker waits between generations (the
// coordinator may then decide it does not hold the current update and roll back; and a rank
// that gave its generation up must end it) — or still saying so once it is a rank again.
TEST_F(CoordinatorLinkTest, HeartbeatsSayIdleOnlyWhileAwaitingAnAssignment) {
  client_.Answer(Assigned(3));
  Start();
  ASSERT_TRUE(link_->AwaitAssignment(2).ok());
  const std::vector<v1::HeartbeatRequest> waiting = client_.heartbeats();
  EXPECT_TRUE(std::any_of(waiting.begin(), waiting.end(), [](const v1::HeartbeatRequest& h) {
    return h.idle_after_generation() == 2;
  }));
  const size_t seen = waiting.size();
  for (int i = 0; i < 2000 && client_.heartbeats().size() <= seen + 1; ++i) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_GT(client_.heartbeats().size(), seen + 1);
  EXPECT_FALSE(client_.heartbeats().back().has_idle_after_generation());  // rank of 3 now
}

// Catches: a change of this worker's place waiting for the next heartbeat (a standby assigned
// late; a rank blocked in a collective learning late that its generation is over). Heartbeats
// here come once an hour: only the pushed place can end the wait.
TEST_F(CoordinatorLinkTest, PushedPlaceEndsTheWaitWithoutAHeartbeat) {
  MakeLink(absl::Hours(1));
  client_.SetHeartbeatInterval(3'600'000);
  client_.EnableAttach();
  v1::HeartbeatResponse waiting;
  waiting.set_job_state(v1::RUNNING);
  client_.Answer(waiting);
  Start();
  for (int i = 0; i < 2000 && client_.attaches() == 0; ++i) absl::SleepFor(absl::Milliseconds(1));
  ASSERT_EQ(client_.attaches(), 1u);
  std::thread push([&] {
    absl::SleepFor(absl::Milliseconds(30));
    client_.Push(Assigned(5));
  });
  const absl::Time start = absl::Now();
  absl::StatusOr<v1::Assignment> a = link_->AwaitAssignment(0);
  push.join();
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->generation(), 5);
  EXPECT_LT(absl::Now() - start, absl::Minutes(1));
  EXPECT_LE(client_.heartbeats().size(), 2u);
}

// Catches: a dropped stream left until the next heartbeat (after a coordinator restart the
// worker would be heard only a heartbeat interval later): it asks at once, and opens the
// stream again.
TEST_F(CoordinatorLinkTest, EndedStreamHeartbeatsAtOnceAndAttachesAgain) {
  MakeLink(absl::Hours(1));
  client_.SetHeartbeatInterval(3'600'000);
  client_.EnableAttach();
  client_.Answer(Assigned(1));
  Start();
  for (int i = 0; i < 2000 && client_.heartbeats().empty(); ++i) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  const size_t before = client_.heartbeats().size();
  client_.EndStream(absl::UnavailableError("coordinator gone"));
  for (int i = 0; i < 2000 && (client_.heartbeats().size() == before || client_.attaches() < 2);
       ++i) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_GT(client_.heartbeats().size(), before);
  EXPECT_EQ(client_.attaches(), 2u);
  EXPECT_EQ(link_->worker_id(), "w1");
}

// Catches an older answer undoing a newer one: a heartbeat answered before the generation
// formed, arriving after the pushed assignment, made the rank think its generation was over
// and abandon its first collective (a flaky ABORT at the start of conformance runs).
TEST_F(CoordinatorLinkTest, AnOlderAnswerDoesNotUndoANewerPlace) {
  MakeLink(absl::Hours(1));
  client_.SetHeartbeatInterval(3'600'000);
  client_.EnableAttach();
  v1::HeartbeatResponse before = Ended(v1::RUNNING, "");  // not assigned yet
  before.set_coordinator_id("c1");
  before.set_state_version(9);
  client_.Answer(before);
  Start();
  v1::HeartbeatResponse assigned = Assigned(1);
  assigned.set_coordinator_id("c1");
  assigned.set_state_version(10);
  client_.Push(assigned);
  absl::StatusOr<v1::Assignment> a = link_->AwaitAssignment(0);
  ASSERT_TRUE(a.ok()) << a.status();
  // The heartbeat answered at version 9 comes in late.
  const size_t seen = client_.heartbeats().size();
  client_.EndStream(absl::UnavailableError("force a heartbeat now"));
  for (int i = 0; i < 2000 && client_.heartbeats().size() == seen; ++i) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_TRUE(link_->KeepWaiting());
  EXPECT_EQ(link_->Snapshot().current_generation, 1);
  // A newer answer still counts.
  v1::HeartbeatResponse gone = Ended(v1::RUNNING, "");
  gone.set_coordinator_id("c1");
  gone.set_state_version(11);
  client_.Push(gone);
  for (int i = 0; i < 2000 && link_->KeepWaiting(); ++i) absl::SleepFor(absl::Milliseconds(1));
  EXPECT_FALSE(link_->KeepWaiting());
}

// Catches: a failure not reported under the worker's current identity.
TEST_F(CoordinatorLinkTest, ReportFailureUsesTheCurrentIdentity) {
  ASSERT_TRUE(link_->Register().ok());
  link_->ReportFailure(absl::InternalError("out of memory"));
  ASSERT_EQ(client_.failures().size(), 1u);
  EXPECT_EQ(client_.failures()[0].worker_id(), "w1");
  EXPECT_EQ(client_.failures()[0].job_id(), "job-1");
  EXPECT_EQ(client_.failures()[0].message(), "out of memory");
}

}  // namespace
}  // namespace trainstep
