#include "coordinator/goodput.h"

#include <algorithm>

#include "core/window_outcome.h"

namespace trainstep {

void GoodputLedger::Add(const v1::UpdateRecord& r) {
  last_end_ms_ = std::max(last_end_ms_, r.end_time_ms());
  switch (OutcomeOf(r)) {
    case v1::ABORT:
      aborted_since_commit_ = true;
      return;
    case v1::SKIP:
      skipped_since_commit_ = true;
      return;
    default:
      break;
  }
  if (first_commit_ms_ == 0) {
    // The wall time starts here: what came before is the processes' start, not training.
    first_commit_ms_ = r.end_time_ms();
  } else {
    const double interval = std::max(0.0, r.update_interval_seconds());
    if (r.optimizer_update_id() <= max_committed_update_) {
      rollback_ += interval;  // this update was committed once already
    } else if (r.generation() != commit_generation_ || aborted_since_commit_) {
      reform_ += interval;
    } else if (skipped_since_commit_) {
      skipped_ += interval;
    } else {
      productive_ += interval;
    }
  }
  commit_generation_ = r.generation();
  max_committed_update_ = std::max(max_committed_update_, r.optimizer_update_id());
  aborted_since_commit_ = skipped_since_commit_ = false;
}

v1::Goodput GoodputLedger::Report() const {
  v1::Goodput g;
  if (first_commit_ms_ == 0) return g;
  const double wall = static_cast<double>(last_end_ms_ - first_commit_ms_) / 1000.0;
  const double storage = std::min(productive_, absl::ToDoubleSeconds(storage_));
  const double productive = productive_ - storage;
  g.set_wall_seconds(wall);
  g.set_productive_seconds(productive);
  g.set_reform_seconds(reform_);
  g.set_rollback_seconds(rollback_);
  g.set_skipped_seconds(skipped_);
  g.set_storage_seconds(storage);
  // A job of one commit has no wall time yet: nothing was lost either.
  g.set_ratio(wall > 0 ? std::clamp(productive / wall, 0.0, 1.0) : 1.0);
  return g;
}

}  // namespace trainstep
