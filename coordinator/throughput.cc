#include "coordinator/throughput.h"

#include <algorithm>
#include <limits>

#include "core/spec.h"
#include "core/window_outcome.h"

namespace trainstep {

v1::Throughput ComputeThroughput(const std::vector<v1::UpdateRecord>& records, const v1::Job& job,
                                 absl::Time now) {
  v1::Throughput t;
  if (job.start_time_ms() <= 0) return t;  // never ran
  absl::Time at = now;
  if (job.end_time_ms() > 0) at = std::min(at, absl::FromUnixMillis(job.end_time_ms()));
  const absl::Time start = absl::FromUnixMillis(job.start_time_ms());
  const absl::Duration span = std::min(kThroughputSpan, at - start);
  if (span <= absl::ZeroDuration()) return t;
  const int64_t from_ms = absl::ToUnixMillis(at - span);
  const int64_t to_ms = absl::ToUnixMillis(at);
  int64_t tokens = 0, updates = 0, windows = 0;
  // The log is in end-time order: walk back from its newest record until the span's start.
  for (auto it = records.rbegin(); it != records.rend() && it->end_time_ms() > from_ms; ++it) {
    if (it->end_time_ms() > to_ms) continue;
    const v1::WindowOutcome outcome = OutcomeOf(*it);
    if (outcome == v1::COMMIT) {
      tokens += it->global_valid_tokens();
      ++updates;
    }
    if (outcome != v1::ABORT) ++windows;
  }
  const double seconds = absl::ToDoubleSeconds(span);
  t.set_span_seconds(seconds);
  t.set_tokens_per_second(static_cast<double>(tokens) / seconds);
  t.set_updates_per_second(static_cast<double>(updates) / seconds);
  t.set_windows_per_second(static_cast<double>(windows) / seconds);
  if (job.state() != v1::RUNNING) return t;
  const v1::JobProgress& p = job.progress();
  if (job.spec().stop().has_max_updates()) {
    if (updates > 0) {
      const int64_t left =
          std::max<int64_t>(0, job.spec().stop().max_updates() - p.optimizer_update_id());
      t.set_eta_seconds(static_cast<double>(left) / t.updates_per_second());
    }
  } else if (p.windows_per_epoch() > 0 && windows > 0) {
    const int64_t total = JobTotalWindows(job.spec(), p.windows_per_epoch());
    if (total == std::numeric_limits<int64_t>::max()) return t;  // beyond any horizon: no ETA
    const int64_t left = std::max<int64_t>(0, total - p.window_id());
    t.set_eta_seconds(static_cast<double>(left) / t.windows_per_second());
  }
  return t;
}

}  // namespace trainstep
