// Learning-rate schedules as pure functions of scheduler_step, the number of committed
// updates before the one being made (docs/numerics.md, rule 17). Nothing else advances them.
#ifndef TRAINSTEP_COORDINATOR_LR_SCHEDULE_H_
#define TRAINSTEP_COORDINATOR_LR_SCHEDULE_H_

#include <cstdint>

#include "trainstep/v1/spec.pb.h"

namespace trainstep {

// The multiplier of the base lr for the update made at `scheduler_step` (0 = the first update):
//   warmup (step < W):  (step + 1) / W        — the first update is not wasted at lr 0
//   then, with p = clamp((step - W) / (T - W), 0, 1) and m = min_lr_ratio:
//     cosine:  m + (1 - m) · ½ · (1 + cos(π p))
//     linear:  m + (1 - m) · (1 - p)
//   constant: 1
double LrFactor(const v1::Schedule& schedule, int64_t scheduler_step);

// Base lr of the resolved spec's optimizer × LrFactor. Param groups scale this.
double LearningRate(const v1::JobSpec& resolved, int64_t scheduler_step);

}  // namespace trainstep

#endif  // TRAINSTEP_COORDINATOR_LR_SCHEDULE_H_
