#include "coordinator/report_validation.h"

#include <cmath>
#include <limits>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"

namespace trainstep {
namespace {

constexpr size_t kMaxModelConfigBytes = 64 * 1024;
// A failed checkpoint's error: the OS message and a path (the worker sends at most 1 KiB).
constexpr size_t kMaxCheckpointError = 4096;

std::string Bound(int64_t v) {
  if (v == kMaxUnits) return "2^53";
  if (v == kMaxCallsPerWindow) return "2^32";
  return absl::StrCat(v);
}

// "<Request>.<field> must be ≥ lo and ≤ hi, got v".
absl::Status InRange(absl::string_view request, absl::string_view field, int64_t v, int64_t lo,
                     int64_t hi) {
  if (v >= lo && v <= hi) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(request, ".", field, " must be ≥ ", lo, " and ≤ ", Bound(hi), ", got ", v));
}

absl::Status AtLeast(absl::string_view request, absl::string_view field, int64_t v, int64_t lo) {
  if (v >= lo) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(request, ".", field, " must be ≥ ", lo, ", got ", v));
}

// The coordinates every window report carries.
template <typename Req>
absl::Status ValidateWindowCoordinates(absl::string_view request, const Req& req) {
  if (absl::Status s = AtLeast(request, "generation", req.generation(), 1); !s.ok()) return s;
  if (absl::Status s = AtLeast(request, "window_id", req.window_id(), 1); !s.ok()) return s;
  if (absl::Status s = AtLeast(request, "rank", req.rank(), 0); !s.ok()) return s;
  return InRange(request, "valid_units", req.valid_units(), 0, kMaxUnits);
}

// A begin report riding on a CompleteWindow is the same rank's, for the window after it.
absl::Status ValidateNextBegin(const v1::CompleteWindowRequest& req) {
  const v1::BeginWindowRequest& next = req.next();
  constexpr absl::string_view kNext = "CompleteWindowRequest.next";
  if (absl::Status s = ValidateWindowCoordinates(kNext, next); !s.ok()) return s;
  const auto differs = [&](absl::string_view field, const std::string& got,
                           const std::string& want) {
    return absl::InvalidArgumentError(
        absl::StrCat(kNext, ".", field, " must be ", want, " (the report it rides on), got ", got));
  };
  if (next.job_id() != req.job_id()) return differs("job_id", next.job_id(), req.job_id());
  if (next.worker_id() != req.worker_id()) {
    return differs("worker_id", next.worker_id(), req.worker_id());
  }
  if (next.generation() != req.generation()) {
    return differs("generation", absl::StrCat(next.generation()), absl::StrCat(req.generation()));
  }
  if (next.rank() != req.rank()) {
    return differs("rank", absl::StrCat(next.rank()), absl::StrCat(req.rank()));
  }
  if (next.window_id() != req.window_id() + 1) {
    return differs("window_id", absl::StrCat(next.window_id()), absl::StrCat(req.window_id() + 1));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateHeartbeat(const v1::HeartbeatRequest& req) {
  constexpr absl::string_view kRequest = "HeartbeatRequest";
  if (absl::Status s = AtLeast(kRequest, "applied_update_id", req.applied_update_id(), 0);
      !s.ok()) {
    return s;
  }
  if (req.has_idle_after_generation()) {
    if (absl::Status s = AtLeast(kRequest, "idle_after_generation", req.idle_after_generation(), 0);
        !s.ok()) {
      return s;
    }
  }
  if (!req.has_dataset()) return absl::OkStatus();
  // A config.json is a few hundred bytes; the bound keeps a faulty worker's report from
  // growing the journal and every job answer.
  if (req.dataset().model_config().ByteSizeLong() > kMaxModelConfigBytes) {
    return absl::InvalidArgumentError(absl::StrCat(kRequest, ".dataset.model_config is ",
                                                   req.dataset().model_config().ByteSizeLong(),
                                                   " bytes, more than ", kMaxModelConfigBytes));
  }
  return InRange(kRequest, "dataset.samples", req.dataset().samples(), 1, kMaxUnits);
}

absl::Status ValidateBeginWindow(const v1::BeginWindowRequest& req) {
  return ValidateWindowCoordinates("BeginWindowRequest", req);
}

absl::Status ValidateCompleteWindow(const v1::CompleteWindowRequest& req) {
  constexpr absl::string_view kRequest = "CompleteWindowRequest";
  if (absl::Status s = ValidateWindowCoordinates(kRequest, req); !s.ok()) return s;
  if (absl::Status s = InRange(kRequest, "micro_steps", req.micro_steps(), 0, kMaxCallsPerWindow);
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          InRange(kRequest, "allreduce_calls", req.allreduce_calls(), 0, kMaxCallsPerWindow);
      !s.ok()) {
    return s;
  }
  // A norm is never negative; NaN and +inf are reports of overflow, not errors.
  for (const auto& [field, norm] : {std::pair<const char*, double>{"grad_norm", req.grad_norm()},
                                    {"grad_norm_scaled", req.grad_norm_scaled()}}) {
    if (norm < 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s.%s must be ≥ 0 (or NaN/+inf for an overflowed gradient), got %g",
                          kRequest, field, norm));
    }
  }
  if (req.has_phases()) {
    const v1::WindowPhases& p = req.phases();
    for (const auto& [field, seconds] :
         {std::pair<const char*, double>{"data_seconds", p.data_seconds()},
          {"compute_seconds", p.compute_seconds()},
          {"allreduce_seconds", p.allreduce_seconds()},
          {"coordinator_seconds", p.coordinator_seconds()}}) {
      // A day bounds any one window's phase; beyond it the clock or the report is broken.
      if (!(seconds >= 0.0 && seconds <= 86400.0)) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "%s.phases.%s must be between 0 and 86400 seconds, got %g", kRequest, field, seconds));
      }
    }
  }
  // A window is computed at most twice (spec.validate); a re-run names at most 4 samples.
  if (absl::Status s = InRange(kRequest, "run", req.run(), 0, 2); !s.ok()) return s;
  if (absl::Status s = InRange(kRequest, "sample_losses size", req.sample_losses_size(), 0, 4);
      !s.ok()) {
    return s;
  }
  for (const v1::SampleLoss& s : req.sample_losses()) {
    if (absl::Status st = InRange(kRequest, "sample_losses.sample_id", s.sample_id(), 0, kMaxUnits);
        !st.ok()) {
      return st;
    }
  }
  if (req.has_next()) return ValidateNextBegin(req);
  return absl::OkStatus();
}

absl::Status ValidateReportEval(const v1::ReportEvalRequest& req) {
  constexpr absl::string_view kRequest = "ReportEvalRequest";
  if (absl::Status s = AtLeast(kRequest, "generation", req.generation(), 1); !s.ok()) return s;
  if (absl::Status s = AtLeast(kRequest, "rank", req.rank(), 0); !s.ok()) return s;
  if (absl::Status s = AtLeast(kRequest, "optimizer_update_id", req.optimizer_update_id(), 1);
      !s.ok()) {
    return s;
  }
  return InRange(kRequest, "valid_units", req.valid_units(), 0, kMaxUnits);
}

absl::Status ValidateAckCheckpoint(const v1::AckCheckpointRequest& req) {
  constexpr absl::string_view kRequest = "AckCheckpointRequest";
  if (absl::Status s = AtLeast(kRequest, "checkpoint_id", req.checkpoint_id(), 0); !s.ok()) {
    return s;
  }
  if (req.error().size() > kMaxCheckpointError) {
    return absl::InvalidArgumentError(absl::StrCat(kRequest, ".error is ", req.error().size(),
                                                   " bytes, more than ", kMaxCheckpointError));
  }
  return AtLeast(kRequest, "optimizer_update_id", req.optimizer_update_id(), 0);
}

int64_t SaturatingAdd(int64_t a, int64_t b) {
  int64_t sum;
  if (!__builtin_add_overflow(a, b, &sum)) return sum;
  return b > 0 ? std::numeric_limits<int64_t>::max() : std::numeric_limits<int64_t>::min();
}

}  // namespace trainstep
