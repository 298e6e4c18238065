// Throughput of a job as users read it (`job get`, `job watch`, the Python client): committed
// tokens and updates per second over the last minute of the per-update log, and the time left
// to the stop condition at that pace. A pure function of the log and an injected `now`, so it
// is tested without clocks or sleeps and every reader computes the same numbers.
#ifndef TRAINSTEP_COORDINATOR_THROUGHPUT_H_
#define TRAINSTEP_COORDINATOR_THROUGHPUT_H_

#include <vector>

#include "absl/time/time.h"
#include "trainstep/v1/types.pb.h"

namespace trainstep {

// How far back the rates look.
inline constexpr absl::Duration kThroughputSpan = absl::Minutes(1);

// `records`: the job's per-update log, oldest first (only its tail within the span is read).
// `job`: its state, start/end times, progress and resolved spec. `now`: the time of the answer;
// a job that ended is measured at its end (its last minute), not at `now`.
// The span is the last minute before that moment, or less when the job started less than a
// minute before it (0 before the start: every rate 0). Tokens and updates count commits whose
// end_time_ms lies in (moment − span, moment]; windows count commits and skips.
// The ETA is set while the job is RUNNING with a positive rate: the updates left to
// stop.max_updates ÷ updates/s, or, bounded by epochs, the windows left ÷ windows/s.
v1::Throughput ComputeThroughput(const std::vector<v1::UpdateRecord>& records, const v1::Job& job,
                                 absl::Time now);

}  // namespace trainstep

#endif  // TRAINSTEP_COORDINATOR_THROUGHPUT_H_
