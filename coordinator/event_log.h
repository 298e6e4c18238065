// The coordinator's event log on stderr: one line per ended window (the per-update
// record as JSON with --log-format json), plus job and membership changes.
#ifndef TRAINSTEP_COORDINATOR_EVENT_LOG_H_
#define TRAINSTEP_COORDINATOR_EVENT_LOG_H_

#include <memory>
#include <vector>

#include "coordinator/metrics.h"

namespace trainstep {

class EventLog : public CoordinatorMetrics {
 public:
  void OnRecord(const v1::JournalRecord& record, const v1::Job& job) override;
  void OnJobStates(const std::vector<v1::Job>&) override {}
  void OnWorkers(const std::string&, const std::vector<v1::WorkerInfo>&) override {}
  void OnJournalFsync(double) override {}
  void OnJournalWritable(bool) override {}  // the coordinator logs it
  void OnRejected(absl::string_view, absl::string_view) override {}
  void OnBarrierWait(absl::string_view, double) override {}
  void OnAuthFailure(absl::string_view, absl::string_view) override {}  // rpc_auth.cc logs them
};

// Forwards every call to each of `sinks` (not owned).
class FanoutMetrics : public CoordinatorMetrics {
 public:
  explicit FanoutMetrics(std::vector<CoordinatorMetrics*> sinks) : sinks_(std::move(sinks)) {}
  void OnRecord(const v1::JournalRecord& record, const v1::Job& job) override {
    for (auto* s : sinks_) s->OnRecord(record, job);
  }
  void OnJobStates(const std::vector<v1::Job>& jobs) override {
    for (auto* s : sinks_) s->OnJobStates(jobs);
  }
  void OnWorkers(const std::string& job_id, const std::vector<v1::WorkerInfo>& workers) override {
    for (auto* s : sinks_) s->OnWorkers(job_id, workers);
  }
  void OnJournalFsync(double seconds) override {
    for (auto* s : sinks_) s->OnJournalFsync(seconds);
  }
  void OnJournalWritable(bool writable) override {
    for (auto* s : sinks_) s->OnJournalWritable(writable);
  }
  void OnRejected(absl::string_view rpc, absl::string_view reason) override {
    for (auto* s : sinks_) s->OnRejected(rpc, reason);
  }
  void OnBarrierWait(absl::string_view phase, double seconds) override {
    for (auto* s : sinks_) s->OnBarrierWait(phase, seconds);
  }
  void OnAuthFailure(absl::string_view method, absl::string_view code) override {
    for (auto* s : sinks_) s->OnAuthFailure(method, code);
  }

 private:
  std::vector<CoordinatorMetrics*> sinks_;
};

}  // namespace trainstep

#endif  // TRAINSTEP_COORDINATOR_EVENT_LOG_H_
