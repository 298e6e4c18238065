// Process-wide glibc malloc settings for a training process (the worker's main calls it
// first thing; the benchmark's plain LibTorch loop calls it too, so that baseline is as fast).
#ifndef TRAINSTEP_WORKER_HOST_MALLOC_CONFIG_H_
#define TRAINSTEP_WORKER_HOST_MALLOC_CONFIG_H_

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace trainstep {

// Every micro-step frees and reallocates the same activation-sized CPU tensors. With glibc's
// defaults, blocks ≥ 128 KiB are mmap'ed and the heap top is trimmed, so each comes back as
// fresh pages to fault in and zero: ~15% of a bf16 tiny_gpt step on 1 core (BENCHMARKS.md,
// Worker). Serving blocks < 32 MiB (glibc's maximum threshold) from the heap and never
// trimming it keeps the steady state fault-free; the cost is that freed memory stays in the
// process (its peak, which every micro-step reaches anyway). Returns false where it could
// not apply them (not glibc).
inline bool ConfigureMallocForTraining() {
#if defined(__GLIBC__)
  const bool mmap_ok = mallopt(M_MMAP_THRESHOLD, 32 << 20) == 1;
  const bool trim_ok = mallopt(M_TRIM_THRESHOLD, 1 << 30) == 1;
  return mmap_ok && trim_ok;
#else
  return false;
#endif
}

}  // namespace trainstep

#endif  // TRAINSTEP_WORKER_HOST_MALLOC_CONFIG_H_
