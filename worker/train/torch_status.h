// LibTorch and c10d report errors by throwing; the worker speaks absl::Status. This is the
// one place the two meet (STYLE: exceptions stop at the LibTorch boundary).
#ifndef TRAINSTEP_WORKER_TRAIN_TORCH_STATUS_H_
#define TRAINSTEP_WORKER_TRAIN_TORCH_STATUS_H_

#include <exception>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace trainstep {

// LibTorch messages carry a C++ backtrace; the first part says what went wrong.
inline std::string ShortWhat(const std::exception& e, size_t limit = 800) {
  std::string msg = e.what();
  if (msg.size() > limit) msg = msg.substr(0, limit) + "…";
  return msg;
}

// Runs `fn`; an exception becomes a Status with `code` and "<what>: <message>".
// UNAVAILABLE is what a lost peer looks like (the worker rejoins); INTERNAL a local fault
// (the job fails with the message).
template <typename Fn>
absl::Status CatchTorch(absl::StatusCode code, const std::string& what, Fn&& fn) {
  try {
    fn();
    return absl::OkStatus();
  } catch (const std::exception& e) {
    return absl::Status(code, absl::StrCat(what, ": ", ShortWhat(e)));
  }
}

}  // namespace trainstep

#endif  // TRAINSTEP_WORKER_TRAIN_TORCH_STATUS_H_
