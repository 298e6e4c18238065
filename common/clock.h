// Time as a dependency: the state machine never reads the clock itself; callers pass
// `now`. Drivers and services take a Clock so tests can step time by hand.
#ifndef TRAINSTEP_COMMON_CLOCK_H_
#define TRAINSTEP_COMMON_CLOCK_H_

#include <chrono>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace trainstep {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;
};

class RealClock : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
  static RealClock* Get() {
    static RealClock* clock = new RealClock();
    return clock;
  }
};

// Thread-safe; time moves only when a test says so.
class FakeClock : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::FromUnixSeconds(1'700'000'000)) : now_(start) {}
  absl::Time Now() const override {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    now_ += d;
  }

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
};

// Seconds since it was started, on a steady clock: a duration that a step of the wall clock
// (NTP, a resumed VM) cannot make negative or huge. Workers report such durations (phase
// times), and the coordinator refuses reports whose times are out of range.
class Stopwatch {
 public:
  Stopwatch() : start_(std::chrono::steady_clock::now()) {}
  double Seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }
  void Restart() { start_ = std::chrono::steady_clock::now(); }

 private:
  std::chrono::steady_clock::time_point start_;
};

}  // namespace trainstep

#endif  // TRAINSTEP_COMMON_CLOCK_H_
