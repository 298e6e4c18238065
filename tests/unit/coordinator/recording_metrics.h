// A CoordinatorMetrics that records every call, for tests that check what the coordinator
// reports without a Prometheus registry. Thread-safe: the journal's syncer thread reports
// fsyncs while RPC threads report the rest.
#ifndef TRAINSTEP_TESTS_UNIT_COORDINATOR_RECORDING_METRICS_H_
#define TRAINSTEP_TESTS_UNIT_COORDINATOR_RECORDING_METRICS_H_

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "coordinator/metrics.h"

namespace trainstep {
namespace testing_util {

class RecordingMetrics : public CoordinatorMetrics {
 public:
  struct Recorded {
    v1::JournalRecord record;
    v1::Job job;  // the job as OnRecord saw it, after the record was applied
  };

  void OnRecord(const v1::JournalRecord& record, const v1::Job& job) override {
    absl::MutexLock lock(&mu_);
    records_.push_back({record, job});
  }
  void OnJobStates(const std::vector<v1::Job>& jobs) override {
    absl::MutexLock lock(&mu_);
    job_states_.push_back(jobs);
  }
  void OnWorkers(const std::string& job_id, const std::vector<v1::WorkerInfo>& workers) override {
    absl::MutexLock lock(&mu_);
    workers_[job_id] = workers;
  }
  void OnJournalFsync(double seconds) override {
    absl::MutexLock lock(&mu_);
    fsyncs_.push_back(seconds);
  }
  void OnJournalWritable(bool writable) override {
    absl::MutexLock lock(&mu_);
    journal_writable_.push_back(writable);
  }
  std::vector<bool> journal_writable() const {
    absl::MutexLock lock(&mu_);
    return journal_writable_;
  }
  void OnRejected(absl::string_view rpc, absl::string_view reason) override {
    absl::MutexLock lock(&mu_);
    rejected_.emplace_back(std::string(rpc), std::string(reason));
  }
  void OnBarrierWait(absl::string_view phase, double seconds) override {
    absl::MutexLock lock(&mu_);
    barrier_waits_.emplace_back(std::string(phase), seconds);
  }
  void OnAuthFailure(absl::string_view method, absl::string_view code) override {
    absl::MutexLock lock(&mu_);
    auth_failures_.emplace_back(std::string(method), std::string(code));
  }

  std::vector<Recorded> records() const {
    absl::MutexLock lock(&mu_);
    return records_;
  }
  std::vector<std::vector<v1::Job>> job_states() const {
    absl::MutexLock lock(&mu_);
    return job_states_;
  }
  std::vector<v1::WorkerInfo> workers(const std::string& job_id) const {
    absl::MutexLock lock(&mu_);
    auto it = workers_.find(job_id);
    return it == workers_.end() ? std::vector<v1::WorkerInfo>() : it->second;
  }
  std::vector<double> fsyncs() const {
    absl::MutexLock lock(&mu_);
    return fsyncs_;
  }
  std::vector<std::pair<std::string, std::string>> rejected() const {
    absl::MutexLock lock(&mu_);
    return rejected_;
  }
  std::vector<std::pair<std::string, double>> barrier_waits() const {
    absl::MutexLock lock(&mu_);
    return barrier_waits_;
  }
  std::vector<std::pair<std::string, std::string>> auth_failures() const {
    absl::MutexLock lock(&mu_);
    return auth_failures_;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<Recorded> records_ ABSL_GUARDED_BY(mu_);
  std::vector<std::vector<v1::Job>> job_states_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::vector<v1::WorkerInfo>> workers_ ABSL_GUARDED_BY(mu_);
  std::vector<double> fsyncs_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> journal_writable_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<std::string, std::string>> rejected_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<std::string, double>> barrier_waits_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<std::string, std::string>> auth_failures_ ABSL_GUARDED_BY(mu_);
};

}  // namespace testing_util
}  // namespace trainstep

#endif  // TRAINSTEP_TESTS_UNIT_COORDINATOR_RECORDING_METRICS_H_
