#ifndef TRAINSTEP_COMMON_RECORD_POSITION_H_
#define TRAINSTEP_COMMON_RECORD_POSITION_H_

#include <utility>

#include "trainstep/v1/job_service.pb.h"
#include "trainstep/v1/types.pb.h"

namespace trainstep {

// Where a record sits in the per-update log, which is ordered by (generation, window_id), each
// pair once (v1::RecordPosition). WatchJob resumes after a position; `job watch` drops a record
// that is not after the last one it handled (the Python client does the same with tuples).
inline v1::RecordPosition PositionOf(const v1::UpdateRecord& r) {
  v1::RecordPosition p;
  p.set_generation(r.generation());
  p.set_window_id(r.window_id());
  return p;
}

inline bool IsAfter(const v1::UpdateRecord& r, const v1::RecordPosition& p) {
  return std::make_pair(r.generation(), r.window_id()) >
         std::make_pair(p.generation(), p.window_id());
}

}  // namespace trainstep

#endif  // TRAINSTEP_COMMON_RECORD_POSITION_H_
