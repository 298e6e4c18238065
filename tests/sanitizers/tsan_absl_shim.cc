// ThreadSanitizer cannot see inside Debian's libabsl_synchronization: it is not built with
// -fsanitize=thread, so absl::Mutex's lock and unlock (its own futex code, not pthreads) create
// no happens-before edges, and every access a Mutex guards would be reported as a race. This
// preloaded library (LD_PRELOAD, make check-tsan) interposes the public entry points of
// absl::Mutex, CondVar and Notification, forwards to the real ones and tells TSan what they
// synchronise (__tsan_acquire / __tsan_release on the mutex). gRPC's own absl::Mutex calls go
// through it too. Built without instrumentation; in an uninstrumented process (a shell a test
// runs) the TSan hooks are absent (weak) and it only forwards.
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

extern "C" void __tsan_acquire(void* addr) __attribute__((weak));
extern "C" void __tsan_release(void* addr) __attribute__((weak));

namespace {

void Acquire(const void* addr) {
  if (__tsan_acquire != nullptr) __tsan_acquire(const_cast<void*>(addr));
}
void Release(const void* addr) {
  if (__tsan_release != nullptr) __tsan_release(const_cast<void*>(addr));
}

// The real function behind `symbol` (the next definition after this library), or abort: a
// shim that silently forwarded nowhere would hide every race it exists to let TSan see.
template <typename Fn>
Fn Real(const char* symbol) {
  void* fn = dlsym(RTLD_NEXT, symbol);
  if (fn == nullptr) {
    std::fprintf(stderr, "tsan_absl_shim: %s not found (another Abseil build?)\n", symbol);
    std::abort();
  }
  return reinterpret_cast<Fn>(fn);
}

// Notification's flag follows its Mutex (absl/synchronization/notification.h): one address per
// Notification for Notify and for the inline HasBeenNotified's check of the flag.
constexpr size_t kFlagOffset = sizeof(absl::Mutex);
const void* NotificationOf(const std::atomic<bool>* flag) {
  return reinterpret_cast<const char*>(flag) - kFlagOffset;
}

// Abseil's deadlock detector keeps a global lock-order graph behind an internal spinlock that
// TSan cannot see, so every access to it is reported as a race. It looks for lock-order
// cycles, not data races, and the ordinary `make test` runs keep it as Abseil sets it; only
// the processes this library is preloaded into run without it.
__attribute__((constructor)) void DisableAbseilDeadlockDetection() {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
}

}  // namespace

using absl::Condition;
using absl::CondVar;
using absl::Duration;
using absl::Mutex;
using absl::Notification;
using absl::Time;

// Every name below is the mangled name of the function it replaces (nm -D
// libabsl_synchronization.so); Debian's Abseil puts everything in the inline namespace debian3.
#define SHIM(ret, mangled, params, args, before, after)     \
  extern "C" ret mangled params {                           \
    static const auto real = Real<ret(*) params>(#mangled); \
    before;                                                 \
    auto result = real args;                                \
    after;                                                  \
    return result;                                          \
  }
#define SHIM_VOID(mangled, params, args, before, after)      \
  extern "C" void mangled params {                           \
    static const auto real = Real<void(*) params>(#mangled); \
    before;                                                  \
    real args;                                               \
    after;                                                   \
  }

// Mutex: acquire after every way of taking it, release before every way of giving it up.
SHIM_VOID(_ZN4absl7debian35Mutex4LockEv, (Mutex * m), (m), , Acquire(m))
SHIM_VOID(_ZN4absl7debian35Mutex10ReaderLockEv, (Mutex * m), (m), , Acquire(m))
SHIM_VOID(_ZN4absl7debian35Mutex6UnlockEv, (Mutex * m), (m), Release(m), )
SHIM_VOID(_ZN4absl7debian35Mutex12ReaderUnlockEv, (Mutex * m), (m), Release(m), )
SHIM(bool, _ZN4absl7debian35Mutex7TryLockEv, (Mutex * m), (m), , if (result) Acquire(m))
SHIM(bool, _ZN4absl7debian35Mutex13ReaderTryLockEv, (Mutex * m), (m), , if (result) Acquire(m))
SHIM_VOID(_ZN4absl7debian35Mutex8LockWhenERKNS0_9ConditionE, (Mutex * m, const Condition& c),
          (m, c), , Acquire(m))
SHIM_VOID(_ZN4absl7debian35Mutex14ReaderLockWhenERKNS0_9ConditionE, (Mutex * m, const Condition& c),
          (m, c), , Acquire(m))
// The timed variants return with the lock held whatever they return.
SHIM(bool, _ZN4absl7debian35Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE,
     (Mutex * m, const Condition& c, Duration d), (m, c, d), , Acquire(m))
SHIM(bool, _ZN4absl7debian35Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE,
     (Mutex * m, const Condition& c, Time t), (m, c, t), , Acquire(m))
SHIM(bool, _ZN4absl7debian35Mutex25ReaderLockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE,
     (Mutex * m, const Condition& c, Duration d), (m, c, d), , Acquire(m))
SHIM(bool, _ZN4absl7debian35Mutex26ReaderLockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE,
     (Mutex * m, const Condition& c, Time t), (m, c, t), , Acquire(m))
// Waiting releases the mutex and takes it again.
SHIM_VOID(_ZN4absl7debian35Mutex5AwaitERKNS0_9ConditionE, (Mutex * m, const Condition& c), (m, c),
          Release(m), Acquire(m))
SHIM(bool, _ZN4absl7debian35Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE,
     (Mutex * m, const Condition& c, Duration d), (m, c, d), Release(m), Acquire(m))
SHIM(bool, _ZN4absl7debian35Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE,
     (Mutex * m, const Condition& c, Time t), (m, c, t), Release(m), Acquire(m))
SHIM_VOID(_ZN4absl7debian37CondVar4WaitEPNS0_5MutexE, (CondVar * cv, Mutex* m), (cv, m), Release(m),
          Acquire(m))
SHIM(bool, _ZN4absl7debian37CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE,
     (CondVar * cv, Mutex* m, Duration d), (cv, m, d), Release(m), Acquire(m))
SHIM(bool, _ZN4absl7debian37CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE,
     (CondVar * cv, Mutex* m, Time t), (cv, m, t), Release(m), Acquire(m))

// Notification: Notify happens before every wait or check that sees it.
SHIM_VOID(_ZN4absl7debian312Notification6NotifyEv, (Notification * n), (n), Release(n), )
SHIM(bool, _ZN4absl7debian312Notification23HasBeenNotifiedInternalEPKSt6atomicIbE,
     (const std::atomic<bool>* flag), (flag), , if (result) Acquire(NotificationOf(flag)))
SHIM_VOID(_ZNK4absl7debian312Notification19WaitForNotificationEv, (const Notification* n), (n), ,
          Acquire(n))
SHIM(bool, _ZNK4absl7debian312Notification30WaitForNotificationWithTimeoutENS0_8DurationE,
     (const Notification* n, Duration d), (n, d), , if (result) Acquire(n))
SHIM(bool, _ZNK4absl7debian312Notification31WaitForNotificationWithDeadlineENS0_4TimeE,
     (const Notification* n, Time t), (n, t), , if (result) Acquire(n))
