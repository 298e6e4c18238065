// bf16 on a CPU without native bf16 instructions is emulated and can be tens of times slower
// than fp32 (42 ms against 1.0 ms for a Linear). A bf16 job on such a CPU gets a
// warning at worker start that names the reason and the cost, measured on the spot.
#ifndef TRAINSTEP_WORKER_HOST_BF16_PROBE_H_
#define TRAINSTEP_WORKER_HOST_BF16_PROBE_H_

#include <string>

#include "absl/status/statusor.h"
#include "worker/host/cpu_info.h"

namespace trainstep {

struct Bf16Cost {
  double fp32_seconds = 0;  // one small Linear forward in fp32, best of a few runs
  double bf16_seconds = 0;  // the same under bf16 autocast
};

// Times a Linear(256, 256) forward on 64 rows in fp32 and under CPU bf16 autocast, with the
// current thread settings: a few milliseconds where bf16 is emulated, well under one where
// it is native.
absl::StatusOr<Bf16Cost> MeasureBf16Cost();

// The start-up line for a bf16 job on this CPU. *emulated: the CPU has no native bf16 (the
// line is then a warning). `cost` may hold the measurement's error.
std::string Bf16Notice(const CpuInfo& cpu, const absl::StatusOr<Bf16Cost>& cost, bool* emulated);

// Measures and logs Bf16Notice (a warning where bf16 is emulated).
void LogBf16Notice(const CpuInfo& cpu);

}  // namespace trainstep

#endif  // TRAINSTEP_WORKER_HOST_BF16_PROBE_H_
