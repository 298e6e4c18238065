// What travels with every call into the Coordinator: how it is answered (Done), how the RPC
// layer tracks it (CallHandle), and who makes it (CallContext).
#ifndef TRAINSTEP_COORDINATOR_CALL_H_
#define TRAINSTEP_COORDINATOR_CALL_H_

#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "coordinator/job_registry.h"

namespace trainstep {

template <typename T>
using Done = std::function<void(absl::StatusOr<T>)>;

// Shared by an RPC and the coordinator. Whoever claims it first answers the call: the
// coordinator's answer or the RPC layer's cancellation (deadline, client gone). A claimed
// handle tells the coordinator to stop polling the call.
class CallHandle {
 public:
  bool Claim() { return !claimed_.exchange(true); }
  bool claimed() const { return claimed_.load(); }

 private:
  std::atomic<bool> claimed_{false};
};

// A call's handle and caller. Converts from either alone (or nullptr), so that a test states
// only what it cares about.
struct CallContext {
  CallContext() = default;
  CallContext(std::nullptr_t) {}
  CallContext(std::shared_ptr<CallHandle> h) : handle(std::move(h)) {}
  CallContext(Caller c) : caller(std::move(c)) {}
  CallContext(std::shared_ptr<CallHandle> h, Caller c)
      : handle(std::move(h)), caller(std::move(c)) {}

  // Null: nobody abandons the call (a waiting one is polled until answered or shut down).
  std::shared_ptr<CallHandle> handle;
  Caller caller;       // as the RPC layer's authorization found it (job_registry.h)
  absl::Time arrived;  // set by the coordinator: when the call came in (barrier wait metrics)
};

}  // namespace trainstep

#endif  // TRAINSTEP_COORDINATOR_CALL_H_
