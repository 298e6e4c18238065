#include "core/hang.h"

#include <algorithm>

namespace trainstep {
namespace {

absl::Duration FromProto(const google::protobuf::Duration& d) {
  return absl::Seconds(d.seconds()) + absl::Nanoseconds(d.nanos());
}

}  // namespace

HangPolicy HangPolicyOf(const v1::JobSpec& resolved) {
  HangPolicy p;
  const v1::Hang& h = resolved.hang();
  if (h.has_floor()) p.floor = FromProto(h.floor());
  if (h.has_cap()) p.cap = FromProto(h.cap());
  if (h.has_factor()) p.factor = h.factor();
  return p;
}

absl::Duration ShortStepDeadline(const HangPolicy& policy,
                                 std::optional<absl::Duration> slowest_recent_window) {
  if (!slowest_recent_window.has_value()) return policy.cap;
  return std::clamp(*slowest_recent_window * policy.factor, policy.floor, policy.cap);
}

bool IsShortStep(v1::ComputePhase phase) {
  return phase == v1::COMPUTE_PHASE_DATA || phase == v1::COMPUTE_PHASE_FORWARD_BACKWARD ||
         phase == v1::COMPUTE_PHASE_OPTIMIZER;
}

bool IsOwnWork(v1::ComputePhase phase) {
  return IsShortStep(phase) || phase == v1::COMPUTE_PHASE_EVAL ||
         phase == v1::COMPUTE_PHASE_CHECKPOINT;
}

bool IsWaitForPeers(v1::ComputePhase phase) {
  return phase == v1::COMPUTE_PHASE_REPORT || phase == v1::COMPUTE_PHASE_ALLREDUCE ||
         phase == v1::COMPUTE_PHASE_JOIN;
}

absl::Duration PhaseDeadline(const HangPolicy& policy, v1::ComputePhase phase,
                             absl::Duration short_step_deadline) {
  return IsShortStep(phase) ? short_step_deadline : policy.cap;
}

std::string PhaseName(v1::ComputePhase phase) {
  switch (phase) {
    case v1::COMPUTE_PHASE_IDLE:
      return "waiting for an assignment";
    case v1::COMPUTE_PHASE_JOIN:
      return "joining the collective";
    case v1::COMPUTE_PHASE_DATA:
      return "data";
    case v1::COMPUTE_PHASE_FORWARD_BACKWARD:
      return "forward/backward";
    case v1::COMPUTE_PHASE_ALLREDUCE:
      return "all-reduce";
    case v1::COMPUTE_PHASE_REPORT:
      return "report";
    case v1::COMPUTE_PHASE_OPTIMIZER:
      return "optimizer";
    case v1::COMPUTE_PHASE_CHECKPOINT:
      return "checkpoint";
    case v1::COMPUTE_PHASE_EVAL:
      return "evaluation";
    default:
      return "unknown";
  }
}

}  // namespace trainstep
