// Where the worker's compute thread is (a step of its own work, or a wait for the others),
// and since when: set by the training loop, read by the heartbeats (the coordinator fences a
// rank stuck in its own work while its peers wait) and by the health service (NOT_SERVING
// past the hang deadline, so that Kubernetes restarts a hung process). Lock-free: the
// training loop must never wait for a reader.
#ifndef TRAINSTEP_WORKER_LINK_COMPUTE_PHASE_H_
#define TRAINSTEP_WORKER_LINK_COMPUTE_PHASE_H_

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "absl/time/time.h"
#include "common/clock.h"
#include "core/hang.h"
#include "trainstep/v1/types.pb.h"

namespace trainstep {

class ComputePhase {
 public:
  explicit ComputePhase(const Clock* clock = RealClock::Get()) : clock_(clock) {}

  // The compute thread enters `phase` now (entering the phase it is in changes nothing: the
  // time counts from when it first entered).
  void Enter(v1::ComputePhase phase) {
    if (phase_.load(std::memory_order_relaxed) == phase) return;
    // The time first: a reader that sees the new phase never pairs it with the old time.
    since_ns_.store(absl::ToUnixNanos(clock_->Now()), std::memory_order_relaxed);
    phase_.store(phase, std::memory_order_release);
  }

  struct Reading {
    v1::ComputePhase phase = v1::COMPUTE_PHASE_UNSPECIFIED;
    absl::Duration in_phase;  // how long it has been there
  };
  Reading Read() const {
    Reading r;
    r.phase = static_cast<v1::ComputePhase>(phase_.load(std::memory_order_acquire));
    r.in_phase =
        std::max(absl::ZeroDuration(),
                 clock_->Now() - absl::FromUnixNanos(since_ns_.load(std::memory_order_relaxed)));
    return r;
  }

  // The coordinator's hang deadlines (HeartbeatResponse): of a short step of this worker's own
  // work, and of a long one (evaluation, checkpoint). Zero: none known (never stuck).
  void SetDeadlines(absl::Duration short_step, absl::Duration cap) {
    short_step_ms_.store(absl::ToInt64Milliseconds(short_step), std::memory_order_relaxed);
    cap_ms_.store(absl::ToInt64Milliseconds(cap), std::memory_order_relaxed);
  }
  // Whether the compute thread has stayed in a step of its own work past its deadline: what
  // the coordinator fences, and what the health service reports NOT_SERVING.
  bool Stuck() const;

 private:
  const Clock* const clock_;
  std::atomic<int> phase_{v1::COMPUTE_PHASE_UNSPECIFIED};
  std::atomic<int64_t> since_ns_{0};
  std::atomic<int64_t> short_step_ms_{0};
  std::atomic<int64_t> cap_ms_{0};
};

inline bool ComputePhase::Stuck() const {
  const Reading now = Read();
  if (!IsOwnWork(now.phase)) return false;
  const int64_t ms = IsShortStep(now.phase) ? short_step_ms_.load(std::memory_order_relaxed)
                                            : cap_ms_.load(std::memory_order_relaxed);
  return ms > 0 && now.in_phase > absl::Milliseconds(ms);
}

}  // namespace trainstep

#endif  // TRAINSTEP_WORKER_LINK_COMPUTE_PHASE_H_
