// Range checks of every number a worker reports, one function per request, applied by the
// step machine before it looks at a report. A report that fails is refused with
// INVALID_ARGUMENT naming the field and changes nothing. The bounds keep every sum the
// coordinator forms over ranks and windows far from int64 overflow and exact in a double.
#ifndef TRAINSTEP_COORDINATOR_REPORT_VALIDATION_H_
#define TRAINSTEP_COORDINATOR_REPORT_VALIDATION_H_

#include <cstdint>

#include "absl/status/status.h"
#include "trainstep/v1/worker_service.pb.h"

namespace trainstep {

// Valid tokens (or samples) of one rank, of one window (Σ over ranks), and of a dataset:
// 2^53, the largest count a double (loss / N) still holds exactly.
inline constexpr int64_t kMaxUnits = int64_t{1} << 53;
// Micro-steps and all-reduce calls of one rank in one window; × 1024 ranks stays < 2^43.
inline constexpr int64_t kMaxCallsPerWindow = int64_t{1} << 32;

absl::Status ValidateHeartbeat(const v1::HeartbeatRequest& req);
absl::Status ValidateBeginWindow(const v1::BeginWindowRequest& req);
// loss_sum may be non-finite (the window is then skipped NONFINITE_LOSS), and grad_norm may be
// NaN or +inf (an overflow window, found_inf, or a norm that overflowed fp32), never negative.
// Its `next` (if set) is a valid begin report of the same job, worker, generation and rank for
// window_id + 1.
absl::Status ValidateCompleteWindow(const v1::CompleteWindowRequest& req);
absl::Status ValidateAckCheckpoint(const v1::AckCheckpointRequest& req);
// loss_sum may be non-finite (weights that overflow on the held-out data): it is recorded so.
absl::Status ValidateReportEval(const v1::ReportEvalRequest& req);

// a + b, clamped to [INT64_MIN, INT64_MAX] instead of wrapping.
int64_t SaturatingAdd(int64_t a, int64_t b);

}  // namespace trainstep

#endif  // TRAINSTEP_COORDINATOR_REPORT_VALIDATION_H_
