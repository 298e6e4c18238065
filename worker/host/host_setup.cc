#include "worker/host/host_setup.h"

#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <sched.h>
#include <signal.h>

#include <cstdlib>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/env.h"
#include "common/log.h"

namespace trainstep {
namespace {

// The text of a /proc or /sys file, or "" where there is none.
std::string ReadText(const std::string& path) {
  return trainstep::Env::Default()->ReadFile(path).value_or("");
}

std::string GetEnv(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "" : v;
}

// The CPU limit of this process's cgroup in cgroup v2's cpu.max form, from v2 or v1 files;
// "" when there is none to read.
std::string CgroupCpuMax() {
  for (absl::string_view line : absl::StrSplit(ReadText("/proc/self/cgroup"), '\n')) {
    if (absl::StartsWith(line, "0::")) {
      std::string own = ReadText(absl::StrCat("/sys/fs/cgroup", line.substr(3), "/cpu.max"));
      if (!own.empty()) return own;
    }
  }
  std::string v2 = ReadText("/sys/fs/cgroup/cpu.max");
  if (!v2.empty()) return v2;
  for (const char* dir : {"/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct"}) {
    const std::string quota(
        absl::StripAsciiWhitespace(ReadText(absl::StrCat(dir, "/cpu.cfs_quota_us"))));
    const std::string period(
        absl::StripAsciiWhitespace(ReadText(absl::StrCat(dir, "/cpu.cfs_period_us"))));
    if (quota.empty() || period.empty()) continue;
    return absl::StrCat(quota == "-1" ? "max" : quota, " ", period);
  }
  return "";
}

int AffinityCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return 1;
  return CPU_COUNT(&set);
}

// OpenBLAS's own entry points, looked up at run time: present only when the libblas.so.3
// the process loaded is OpenBLAS.
template <typename Fn>
Fn OpenBlasFn(const char* name) {
  return reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, name));
}

// openblas_get_parallel(): 0 sequential, 1 pthread, 2 OpenMP; -1 where it cannot be asked.
int OpenBlasParallel() {
  auto parallel = OpenBlasFn<int (*)()>("openblas_get_parallel");
  return parallel == nullptr ? -1 : parallel();
}

std::string OpenBlasConfig() {
  auto config = OpenBlasFn<char* (*)()>("openblas_get_config");
  if (config == nullptr) return "";
  std::string out = config();  // "OpenBLAS 0.3.21 DYNAMIC_ARCH … Haswell MAX_THREADS=64"
  if (absl::StartsWith(out, "OpenBLAS ")) out = out.substr(9);
  const int p = OpenBlasParallel();
  if (p >= 0) absl::StrAppend(&out, p == 0 ? " (sequential)" : p == 1 ? " (pthread)" : " (openmp)");
  return out;
}

}  // namespace

void IgnoreBrokenPipes() { signal(SIGPIPE, SIG_IGN); }

absl::StatusOr<HostSetup> SetUpHost(int threads_flag, const std::string& cpuinfo_path) {
  IgnoreBrokenPipes();
  HostSetup host;
  host.cpu = ParseCpuInfo(ReadText(cpuinfo_path.empty() ? "/proc/cpuinfo" : cpuinfo_path));
  host.blas = FindBlas(ReadText("/proc/self/maps"));
  if (host.blas.kind == BlasLibrary::Kind::kOpenBlas) {
    host.blas_config = OpenBlasConfig();
    host.blas_own_pool = OpenBlasParallel() == 1;
  }

  ThreadSources in;
  in.flag = threads_flag;
  in.omp_num_threads = GetEnv("OMP_NUM_THREADS");
  in.local_world_size = GetEnv("LOCAL_WORLD_SIZE");
  in.affinity_cpus = AffinityCpus();
  in.cgroup_cpu_max = CgroupCpuMax();
  absl::StatusOr<ThreadPlan> plan = PlanThreads(in);
  if (!plan.ok()) return plan.status();
  host.threads = *plan;

  // LibTorch's OpenMP pool (OpenBLAS's OpenMP build follows it); OpenBLAS's pthread build
  // keeps a pool of its own, sized to every core at load unless told.
  at::set_num_threads(host.threads.threads);
  if (auto set = OpenBlasFn<void (*)(int)>("openblas_set_num_threads")) {
    set(host.threads.threads);
  }
  return host;
}

std::string DescribeHost(const HostSetup& host) {
  const std::vector<std::string> bf16 = NativeBf16Flags(host.cpu);
  return absl::StrCat("cpu: ", host.cpu.model.empty() ? "unknown" : host.cpu.model, ", ",
                      host.threads.cores, host.threads.cores == 1 ? " core" : " cores",
                      " for this process; native bf16: ",
                      bf16.empty() ? "no (no avx512_bf16 or amx_bf16)"
                                   : absl::StrCat("yes (", absl::StrJoin(bf16, ", "), ")"),
                      "; blas: ", BlasKindName(host.blas.kind),
                      host.blas_config.empty() ? "" : absl::StrCat(" ", host.blas_config),
                      host.blas.path.empty() ? "" : absl::StrCat(" (", host.blas.path, ")"),
                      "; threads: ", host.threads.threads, " (", host.threads.why, ")");
}

std::vector<std::string> HostWarnings(const HostSetup& host) {
  std::vector<std::string> out;
  if (host.blas.kind == BlasLibrary::Kind::kReference) {
    out.push_back(absl::StrCat("fp32 matrix products run on the reference BLAS (", host.blas.path,
                               "), about 50x slower than OpenBLAS: install libopenblas0-openmp "
                               "(scripts/install-deps.sh does) so that libblas.so.3 points at it"));
  }
  if (host.blas_own_pool && host.threads.threads > 1) {
    out.push_back(absl::StrCat(
        "OpenBLAS's pthread build keeps a thread pool of its own beside LibTorch's OpenMP pool: "
        "with ",
        host.threads.threads,
        " threads they contend (a quarter of the OpenMP build's throughput measured, "
        "BENCHMARKS.md \"BLAS\"); install libopenblas0-openmp and point libblas.so.3 at it"));
  }
  if (host.threads.threads > host.threads.cores) {
    out.push_back(absl::StrCat(host.threads.threads, " threads (", host.threads.why, ") on ",
                               host.threads.cores,
                               " cores: they oversubscribe them; fewer threads run faster"));
  }
  return out;
}

std::string HostJson(const HostSetup& host) {
  std::vector<std::string> bf16;
  for (const std::string& f : NativeBf16Flags(host.cpu)) bf16.push_back(JsonQuote(f));
  return absl::StrCat(
      "{\"cpu_model\": ", JsonQuote(host.cpu.model), ", \"cores\": ", host.threads.cores,
      ", \"native_bf16\": ", bf16.empty() ? "false" : "true", ", \"native_bf16_flags\": [",
      absl::StrJoin(bf16, ", "), "], \"blas\": ", JsonQuote(BlasKindName(host.blas.kind)),
      ", \"blas_path\": ", JsonQuote(host.blas.path),
      ", \"blas_config\": ", JsonQuote(host.blas_config), ", \"threads\": ", host.threads.threads,
      ", \"threads_why\": ", JsonQuote(host.threads.why), "}");
}

}  // namespace trainstep
