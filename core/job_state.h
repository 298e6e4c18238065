#ifndef TRAINSTEP_CORE_JOB_STATE_H_
#define TRAINSTEP_CORE_JOB_STATE_H_

#include "trainstep/v1/types.pb.h"

namespace trainstep {

// A job in one of these states never runs another window: the coordinator stops its step
// machine, workers exit, the CLI stops watching.
inline bool IsTerminal(v1::JobState state) {
  return state == v1::SUCCEEDED || state == v1::FAILED || state == v1::CANCELLED;
}

}  // namespace trainstep

#endif  // TRAINSTEP_CORE_JOB_STATE_H_
