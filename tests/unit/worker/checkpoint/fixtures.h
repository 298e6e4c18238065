// Inputs shared by the checkpoint tests (meta.json, safetensors, checkpoint directories).
#ifndef TRAINSTEP_TESTS_UNIT_WORKER_CHECKPOINT_FIXTURES_H_
#define TRAINSTEP_TESTS_UNIT_WORKER_CHECKPOINT_FIXTURES_H_

#include <cstdint>
#include <limits>
#include <string>

#include "worker/checkpoint/checkpoint_meta.h"

namespace trainstep::ckpt::fixture {

// A CheckpointMeta whose every field is set and whose values are hard to round-trip (a
// quoted job id, int64 max tokens, a loss scale needing all 17 digits).
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

// A safetensors file around a hand-written header, space-padded to 8 bytes unless !pad.
inline std::string Raw(const std::string& json, const std::string& data = "", bool pad = true) {
  std::string header = json;
  if (pad) header.append((8 - header.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(n >> (8 * i));
  return out + header + data;
}

}  // namespace trainstep::ckpt::fixture

#endif  // TRAINSTEP_TESTS_UNIT_WORKER_CHECKPOINT_FIXTURES_H_
