// What the coordinator reports to its metrics, behind a small interface so the core is
// tested with a recording fake and served with prometheus-cpp (prometheus_metrics.h).
#ifndef TRAINSTEP_COORDINATOR_METRICS_H_
#define TRAINSTEP_COORDINATOR_METRICS_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "trainstep/v1/journal.pb.h"
#include "trainstep/v1/types.pb.h"

namespace trainstep {

class CoordinatorMetrics {
 public:
  virtual ~CoordinatorMetrics() = default;
  // A record was journaled and applied; `job` is its job afterwards. Called under the
  // coordinator's lock, in journal order.
  virtual void OnRecord(const v1::JournalRecord& record, const v1::Job& job) = 0;
  // Every job's state, after recovery and after any job changed state.
  virtual void OnJobStates(const std::vector<v1::Job>& jobs) = 0;
  // A job's workers after its membership changed.
  virtual void OnWorkers(const std::string& job_id, const std::vector<v1::WorkerInfo>& workers) = 0;
  virtual void OnJournalFsync(double seconds) = 0;
  // The journal became unwritable (decisions are held) or writable again. Any thread.
  virtual void OnJournalWritable(bool writable) = 0;
  // A worker call was refused because it was stale (code ABORTED) or out of protocol.
  virtual void OnRejected(absl::string_view rpc, absl::string_view reason) = 0;
  // How long a barrier call waited for the other ranks. phase: "begin" | "complete".
  virtual void OnBarrierWait(absl::string_view phase, double seconds) = 0;
  // A call refused for its credentials: code "unauthenticated" | "permission_denied".
  virtual void OnAuthFailure(absl::string_view method, absl::string_view code) = 0;
};

}  // namespace trainstep

#endif  // TRAINSTEP_COORDINATOR_METRICS_H_
