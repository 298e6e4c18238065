// The worker's view of its host, gathered once at start: the CPU (and whether bf16 is
// native), the BLAS actually loaded, and the thread count, which it then applies to
// LibTorch and the BLAS. main.cc logs DescribeHost() and `--host-info` prints HostJson().
#ifndef TRAINSTEP_WORKER_HOST_HOST_SETUP_H_
#define TRAINSTEP_WORKER_HOST_HOST_SETUP_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/host/cpu_info.h"
#include "worker/host/threads.h"

namespace trainstep {

struct HostSetup {
  CpuInfo cpu;
  BlasLibrary blas;
  std::string
      blas_config;  // OpenBLAS: version, build, kernels, threading: "0.3.21 … Haswell … (openmp)"
  // OpenBLAS's pthread build: a thread pool of its own beside LibTorch's OpenMP one.
  bool blas_own_pool = false;
  ThreadPlan threads;
};

// Reads /proc/cpuinfo (or `cpuinfo_path`), /proc/self/maps, the affinity mask, the cgroup CPU
// limit and the environment; plans the threads (`threads_flag`: --threads) and applies them
// to LibTorch's intra-op pool and the BLAS. Ignores SIGPIPE (IgnoreBrokenPipes). Errors name
// the bad flag or variable.
absl::StatusOr<HostSetup> SetUpHost(int threads_flag, const std::string& cpuinfo_path);

// A peer that dies mid-collective closes its sockets, and Gloo's next write to one raises
// SIGPIPE, whose default action would kill this survivor too (one death becoming two). Ignored,
// the write fails with EPIPE: a lost peer, which the worker handles by rejoining. (Python, under
// which PyTorch's own workers run, ignores SIGPIPE at start for the same reason.)
void IgnoreBrokenPipes();

// One line for the start-up log: CPU, native bf16, BLAS, threads.
std::string DescribeHost(const HostSetup& host);
// What an operator should change: the reference BLAS (fp32 GEMMs ~50x slower than
// OpenBLAS), more threads than cores, OpenBLAS's pthread build with more than one thread.
std::vector<std::string> HostWarnings(const HostSetup& host);
// The same as one JSON object, for scripts (deploy/local/demo.sh chooses its precision).
std::string HostJson(const HostSetup& host);

}  // namespace trainstep

#endif  // TRAINSTEP_WORKER_HOST_HOST_SETUP_H_
