// The loss of one micro-batch and how it enters backward (docs/numerics.md, rules 1-6 and 15).
// Every path sums per-unit losses (reduction "sum") and normalises once per window by
// the GLOBAL unit count N the coordinator returned — never by K, never by a local count.
#ifndef TRAINSTEP_WORKER_TRAIN_LOSS_H_
#define TRAINSTEP_WORKER_TRAIN_LOSS_H_

#include <ATen/ATen.h>

#include "trainstep/v1/spec.pb.h"
#include "worker/data/collate.h"

namespace trainstep {

struct MicroBatchTensors {
  at::Tensor input;    // int64 [B, T] token ids, or float [B, F] features
  at::Tensor labels;   // int64 [B, T] (-100 = not trained); token-level only
  at::Tensor targets;  // float [B, O]; sample-level only
  int64_t units = 0;   // valid tokens (token-level) or samples (sample-level)
};

MicroBatchTensors ToTensors(const data::MicroBatch& mb, bool token_level, const at::Device& device);

// Σ of the per-unit losses of the micro-batch, a float32 scalar:
//   token-level:  Σ CE(logits[:, :-1], labels[:, 1:]) with ignore_index -100
//   sample-level: Σ_i mean_j (prediction_ij − target_ij)²
at::Tensor LossSum(const at::Tensor& output, const MicroBatchTensors& mb, bool token_level);

// What LossSum is multiplied by before backward, so that after the all-reduce (SUM) every
// rank holds S · ∇(Σ losses / N):
//   tokens, samples:  S / N
//   microbatch_mean:  S / (units_k · K · W) — the classic mean-of-means bug, kept only to
//                     demonstrate it: short micro-batches are up-weighted.
double BackwardMultiplier(v1::Loss::Normalization normalization, double loss_scale,
                          int64_t global_units, int64_t micro_units, int64_t accumulation_steps,
                          int64_t world_size);

}  // namespace trainstep

#endif  // TRAINSTEP_WORKER_TRAIN_LOSS_H_
