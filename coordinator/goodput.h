// Goodput: where a job's wall time went since its first commit (v1::Goodput). Fed the
// per-update log in order, on the live path and on replay alike, so that a restarted
// coordinator reports the same figures; only the storage holds it saw itself are ephemeral.
#ifndef TRAINSTEP_COORDINATOR_GOODPUT_H_
#define TRAINSTEP_COORDINATOR_GOODPUT_H_

#include <cstdint>

#include "absl/time/time.h"
#include "trainstep/v1/types.pb.h"

namespace trainstep {

class GoodputLedger {
 public:
  // The next record of the per-update log.
  void Add(const v1::UpdateRecord& r);
  // Decisions were held for `held` (the journal could not be written): time lost to storage
  // inside what would otherwise count as the steady pace.
  void AddStorageHold(absl::Duration held) { storage_ += held; }
  // Unset (all zero) before the first commit.
  v1::Goodput Report() const;

 private:
  int64_t first_commit_ms_ = 0;  // 0: no commit yet
  int64_t last_end_ms_ = 0;      // the latest ended window's
  int64_t commit_generation_ = 0;
  int64_t max_committed_update_ = 0;
  bool aborted_since_commit_ = false;
  bool skipped_since_commit_ = false;
  double productive_ = 0, reform_ = 0, rollback_ = 0, skipped_ = 0;
  absl::Duration storage_;
};

}  // namespace trainstep

#endif  // TRAINSTEP_COORDINATOR_GOODPUT_H_
