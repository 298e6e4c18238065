// When a live rank counts as hung (spec.hang): the deadline of each step of a worker's work,
// derived from the job's recent windows, and which steps are its own work and which are waits
// for the others. Shared by the coordinator, which fences a hung rank, and the worker, whose
// health turns NOT_SERVING past the same deadline.
#ifndef TRAINSTEP_CORE_HANG_H_
#define TRAINSTEP_CORE_HANG_H_

#include <optional>
#include <string>

#include "absl/time/time.h"
#include "trainstep/v1/spec.pb.h"
#include "trainstep/v1/types.pb.h"

namespace trainstep {

// spec.hang's defaults, also for the specs of jobs journaled before it. The floor lets a rank
// held for 50 s be fenced well within 10 s on a job of short windows; the cap bounds a
// deadline derived from a few very long windows (and is the deadline of an evaluation or a
// checkpoint, whose length the windows do not tell).
inline constexpr int64_t kDefaultHangFloorSeconds = 5;
inline constexpr int64_t kDefaultHangCapSeconds = 600;
inline constexpr double kDefaultHangFactor = 10;

struct HangPolicy {
  absl::Duration floor = absl::Seconds(kDefaultHangFloorSeconds);
  absl::Duration cap = absl::Seconds(kDefaultHangCapSeconds);
  double factor = kDefaultHangFactor;
};

// spec.hang with every unset field at its default.
HangPolicy HangPolicyOf(const v1::JobSpec& resolved);

// The deadline of a short step of a rank's own work (data, forward/backward, optimizer):
// factor × the slowest recent window, within [floor, cap]; the cap when no window ended yet
// (the first windows include the process's warm-up).
absl::Duration ShortStepDeadline(const HangPolicy& policy,
                                 std::optional<absl::Duration> slowest_recent_window);

// A step of the rank's own work: it alone makes progress there, so staying too long means it
// is stuck (data, forward/backward, optimizer, evaluation, checkpoint).
bool IsOwnWork(v1::ComputePhase phase);
// A short step of its own work, held to ShortStepDeadline; the other own-work steps get the cap.
bool IsShortStep(v1::ComputePhase phase);
// A wait for the others (a barrier at the coordinator, the all-reduce, the rendezvous of a new
// generation): a rank there is blocked by whoever has not arrived.
bool IsWaitForPeers(v1::ComputePhase phase);

// The deadline of `phase` given the short-step deadline (the cap for the long steps).
absl::Duration PhaseDeadline(const HangPolicy& policy, v1::ComputePhase phase,
                             absl::Duration short_step_deadline);

// "data", "forward/backward", "all-reduce", ...: for logs and reasons.
std::string PhaseName(v1::ComputePhase phase);

}  // namespace trainstep

#endif  // TRAINSTEP_CORE_HANG_H_
