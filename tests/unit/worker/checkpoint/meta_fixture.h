// A CheckpointMeta whose every field is set and whose values are hard to round-trip (a
// quoted job id, int64 max tokens, a loss scale needing all 17 digits), shared by the
// meta.json and checkpoint-directory tests.
#ifndef TRAINSTEP_TESTS_UNIT_WORKER_CHECKPOINT_META_FIXTURE_H_
#define TRAINSTEP_TESTS_UNIT_WORKER_CHECKPOINT_META_FIXTURE_H_

#include <cstdint>
#include <limits>

#include "worker/checkpoint/checkpoint_meta.h"

namespace trainstep::ckpt::fixture {

inline CheckpointMeta MetaFor(int64_t id) {
  CheckpointMeta m;
  m.job_id = "job-\"7\"";
  m.checkpoint_id = id;
  m.optimizer_update_id = 1000 + id;
  m.scheduler_step = 2000 + id;
  m.window_id = 3000 + id;
  m.epoch = 4;
  m.cumulative_tokens = std::numeric_limits<int64_t>::max();  // Beyond a double's integers.
  m.loss_scale = 0.1;                                         // Needs all 17 digits to round-trip.
  m.scaler_growth_tracker = -5;
  m.spec_hash = "sha256:0123abcd";
  m.next_window_id = 3001 + id;
  m.written_unix_ms = 1732881600123;
  return m;
}

}  // namespace trainstep::ckpt::fixture

#endif  // TRAINSTEP_TESTS_UNIT_WORKER_CHECKPOINT_META_FIXTURE_H_
