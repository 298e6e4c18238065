// How many compute threads a worker uses: with L workers on a host of C cores each takes
// about C / L, so LibTorch's OpenMP pool and the BLAS's own threads never oversubscribe the
// cores. Pure: host_setup.cc gathers the inputs (flags, environment, affinity, cgroup).
#ifndef TRAINSTEP_WORKER_HOST_THREADS_H_
#define TRAINSTEP_WORKER_HOST_THREADS_H_

#include <string>

#include "absl/status/statusor.h"

namespace trainstep {

struct ThreadSources {
  int flag = 0;                  // --threads; 0 chooses automatically
  std::string omp_num_threads;   // $OMP_NUM_THREADS, "" when unset
  std::string local_world_size;  // $LOCAL_WORLD_SIZE (as torchrun sets it), "" when unset
  int affinity_cpus = 1;         // CPUs this process may run on (sched_getaffinity)
  // The cgroup CPU limit as cgroup v2's cpu.max says it ("max 100000", "200000 100000");
  // "" when there is none to read.
  std::string cgroup_cpu_max;
};

struct ThreadPlan {
  int threads = 1;        // LibTorch intra-op threads, and the BLAS's
  int cores = 1;          // cores this process may use (affinity and cgroup limit)
  int local_workers = 1;  // workers on this host (LOCAL_WORLD_SIZE)
  std::string why;        // for the start-up log: where `threads` came from
};

// Precedence: --threads, then OMP_NUM_THREADS (what PyTorch users already set), then
// cores / LOCAL_WORLD_SIZE (at least 1). A malformed value is an error naming its source.
absl::StatusOr<ThreadPlan> PlanThreads(const ThreadSources& in);

}  // namespace trainstep

#endif  // TRAINSTEP_WORKER_HOST_THREADS_H_
