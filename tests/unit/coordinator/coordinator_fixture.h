// The Coordinator driven directly, as the gRPC services drive it: a journal in a temporary
// directory, a FakeClock, recording metrics, and helpers that submit a job, start its workers
// and run its windows. Used by the tests of the coordinator's call path and of each group of
// its calls.
#ifndef TRAINSTEP_TESTS_UNIT_COORDINATOR_COORDINATOR_FIXTURE_H_
#define TRAINSTEP_TESTS_UNIT_COORDINATOR_COORDINATOR_FIXTURE_H_

#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <future>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "common/clock.h"
#include "common/env.h"
#include "coordinator/coordinator.h"
#include "gtest/gtest.h"
#include "tests/unit/coordinator/machine_test_util.h"
#include "tests/unit/coordinator/recording_metrics.h"
#include "tests/unit/coordinator/sync_gate.h"

namespace trainstep {
namespace testing_util {

constexpr auto kWait = std::chrono::seconds(5);

// One asynchronous call: its Done callback fulfils a promise; waits are always bounded.
template <typename T>
class Call {
 public:
  Call()
      : promise_(std::make_shared<std::promise<absl::StatusOr<T>>>()),
        calls_(std::make_shared<std::atomic<int>>(0)),
        future_(promise_->get_future()) {}

  Done<T> done() {
    return [promise = promise_, calls = calls_](absl::StatusOr<T> result) {
      if (calls->fetch_add(1) == 0) promise->set_value(std::move(result));
    };
  }
  // Answered already? (No waiting: a call that is not ready is parked as a waiter.)
  bool answered() const {
    return future_.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
  }
  absl::StatusOr<T> Get() {
    if (future_.wait_for(kWait) != std::future_status::ready) {
      ADD_FAILURE() << "no answer within 5 s";
      return absl::DeadlineExceededError("test wait timed out");
    }
    return future_.get();
  }
  int calls() const { return calls_->load(); }

 private:
  std::shared_ptr<std::promise<absl::StatusOr<T>>> promise_;
  std::shared_ptr<std::atomic<int>> calls_;
  std::future<absl::StatusOr<T>> future_;
};

class CoordinatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/trainstep_coordinator_test_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    Open();
  }
  void TearDown() override {
    gate_.Release();  // A held snapshot fsync would make the coordinator's destructor wait.
    coordinator_.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  void Open() {
    CoordinatorOptions options;
    options.state_dir = dir_;
    options.clock = &clock_;
    options.env = env_;
    options.snapshot_every_records = snapshot_every_records_;
    options.metrics = &metrics_;
    absl::StatusOr<std::unique_ptr<Coordinator>> c = Coordinator::Open(options);
    ASSERT_TRUE(c.ok()) << c.status();
    coordinator_ = std::move(*c);
  }
  void Reopen() {
    coordinator_.reset();
    Open();
  }

  // A synchronous call: starts it and waits (bounded) for the answer.
  template <typename T, typename F>
  absl::StatusOr<T> Sync(F start) {
    Call<T> call;
    start(call.done());
    return call.Get();
  }

  std::string Submit(int workers) {
    SpecOptions o;
    o.workers = workers;
    return Submit(o);
  }
  std::string Submit(const SpecOptions& o) {
    v1::SubmitJobRequest req;
    req.set_spec_json(SpecJson(o));
    absl::StatusOr<v1::Job> job =
        Sync<v1::Job>([&](Done<v1::Job> d) { coordinator_->SubmitJob(req, std::move(d)); });
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? job->job_id() : "";
  }

  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const std::string& job, const std::string& w) {
    v1::HeartbeatRequest req;
    req.set_job_id(job);
    req.set_worker_id(w);
    req.mutable_dataset()->set_samples(1000);
    req.mutable_dataset()->set_fingerprint("fp");
    return Sync<v1::HeartbeatResponse>(
        [&](Done<v1::HeartbeatResponse> d) { coordinator_->Heartbeat(req, std::move(d)); });
  }

  // Registers `n` workers and reports their dataset; returns worker ids by rank.
  std::vector<std::string> StartWorkers(const std::string& job, int n) {
    std::vector<std::string> ids;
    for (int i = 0; i < n; ++i) {
      v1::RegisterWorkerRequest req;
      req.set_job_id(job);
      absl::StatusOr<v1::RegisterWorkerResponse> r =
          Sync<v1::RegisterWorkerResponse>([&](Done<v1::RegisterWorkerResponse> d) {
            coordinator_->RegisterWorker(req, std::move(d));
          });
      EXPECT_TRUE(r.ok()) << r.status();
      ids.push_back(r.ok() ? r->worker_id() : "");
    }
    std::vector<std::string> by_rank(n);
    for (const std::string& id : ids) EXPECT_TRUE(Heartbeat(job, id).ok());
    for (const std::string& id : ids) {
      absl::StatusOr<v1::HeartbeatResponse> hb = Heartbeat(job, id);
      EXPECT_TRUE(hb.ok() && hb->assigned());
      if (hb.ok() && hb->assigned()) by_rank.at(hb->assignment().rank()) = id;
    }
    return by_rank;
  }

  v1::BeginWindowRequest Begin(const std::string& job, const std::vector<std::string>& ranks,
                               int rank, int64_t window, int64_t units, int64_t generation = 1) {
    v1::BeginWindowRequest req;
    req.set_job_id(job);
    req.set_worker_id(ranks[rank]);
    req.set_generation(generation);
    req.set_window_id(window);
    req.set_rank(rank);
    req.set_valid_units(units);
    return req;
  }
  v1::CompleteWindowRequest Complete(const std::string& job, const std::vector<std::string>& ranks,
                                     int rank, int64_t window, int64_t units,
                                     int64_t generation = 1) {
    v1::CompleteWindowRequest req;
    req.set_job_id(job);
    req.set_worker_id(ranks[rank]);
    req.set_generation(generation);
    req.set_window_id(window);
    req.set_rank(rank);
    req.set_loss_sum(units * 0.5);
    req.set_valid_units(units);
    req.set_grad_norm(1.0);
    req.set_micro_steps(2);
    req.set_allreduce_calls(1);
    return req;
  }

  // Runs window `window` on every rank; returns rank 0's decision.
  v1::WindowDecision RunWindow(const std::string& job, const std::vector<std::string>& ranks,
                               int64_t window) {
    std::vector<Call<v1::BeginWindowResponse>> begins(ranks.size());
    for (size_t r = 0; r < ranks.size(); ++r) {
      coordinator_->BeginWindow(Begin(job, ranks, r, window, 10), begins[r].done(), nullptr);
    }
    for (auto& b : begins) EXPECT_TRUE(b.Get().ok());
    std::vector<Call<v1::CompleteWindowResponse>> completes(ranks.size());
    for (size_t r = 0; r < ranks.size(); ++r) {
      coordinator_->CompleteWindow(Complete(job, ranks, r, window, 10), completes[r].done(),
                                   nullptr);
    }
    v1::WindowDecision first;
    for (size_t r = 0; r < ranks.size(); ++r) {
      absl::StatusOr<v1::CompleteWindowResponse> c = completes[r].Get();
      EXPECT_TRUE(c.ok()) << c.status();
      if (r == 0 && c.ok()) first = c->decision();
    }
    return first;
  }

  absl::StatusOr<v1::Job> GetJob(const std::string& job) {
    v1::GetJobRequest req;
    req.set_job_id(job);
    return Sync<v1::Job>([&](Done<v1::Job> d) { coordinator_->GetJob(req, std::move(d)); });
  }

  std::string dir_;
  uint64_t snapshot_every_records_ = 10000;
  SyncGate gate_{Env::Default()};  // outlives coordinator_
  Env* env_ = Env::Default();      // &gate_ to hold snapshots
  FakeClock clock_;
  RecordingMetrics metrics_;  // outlives coordinator_ (declared before it)
  std::unique_ptr<Coordinator> coordinator_;
};

}  // namespace testing_util
}  // namespace trainstep

#endif  // TRAINSTEP_TESTS_UNIT_COORDINATOR_COORDINATOR_FIXTURE_H_
