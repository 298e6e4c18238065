#include "worker/host/threads.h"

#include <algorithm>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace trainstep {
namespace {

// A positive count from an environment value; OMP_NUM_THREADS may be a nesting list
// ("4,2"), whose first entry is the outer level's.
absl::StatusOr<int> PositiveCount(absl::string_view name, absl::string_view value,
                                  bool first_of_list) {
  absl::string_view v = absl::StripAsciiWhitespace(value);
  if (first_of_list) v = v.substr(0, v.find(','));
  int n = 0;
  if (!absl::SimpleAtoi(v, &n) || n < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, "=\"", value, "\" is not a positive integer"));
  }
  return n;
}

// Whole cores a cgroup v2 cpu.max line allows (rounded down, at least 1: more threads than
// the quota get throttled), or 0 for no limit.
absl::StatusOr<int> CgroupCores(absl::string_view cpu_max) {
  std::vector<absl::string_view> f =
      absl::StrSplit(absl::StripAsciiWhitespace(cpu_max), ' ', absl::SkipEmpty());
  if (f.empty() || f[0] == "max") return 0;
  int64_t quota = 0, period = 100000;
  if (!absl::SimpleAtoi(f[0], &quota) || (f.size() > 1 && !absl::SimpleAtoi(f[1], &period)) ||
      quota <= 0 || period <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cgroup cpu.max \"", cpu_max, "\" is not \"max PERIOD\" or \"QUOTA PERIOD\""));
  }
  return static_cast<int>(std::max<int64_t>(1, quota / period));
}

}  // namespace

absl::StatusOr<ThreadPlan> PlanThreads(const ThreadSources& in) {
  ThreadPlan plan;
  absl::StatusOr<int> limit = CgroupCores(in.cgroup_cpu_max);
  if (!limit.ok()) return limit.status();
  plan.cores = std::max(1, in.affinity_cpus);
  if (*limit > 0 && *limit < plan.cores) plan.cores = *limit;
  if (!in.local_world_size.empty()) {
    absl::StatusOr<int> l = PositiveCount("LOCAL_WORLD_SIZE", in.local_world_size, false);
    if (!l.ok()) return l.status();
    plan.local_workers = *l;
  }
  if (in.flag < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--threads must be 0 (automatic) or positive, got ", in.flag));
  }
  if (in.flag > 0) {
    plan.threads = in.flag;
    plan.why = absl::StrCat("--threads ", in.flag);
    return plan;
  }
  if (!in.omp_num_threads.empty()) {
    absl::StatusOr<int> n = PositiveCount("OMP_NUM_THREADS", in.omp_num_threads, true);
    if (!n.ok()) return n.status();
    plan.threads = *n;
    plan.why = absl::StrCat("OMP_NUM_THREADS=", in.omp_num_threads);
    return plan;
  }
  plan.threads = std::max(1, plan.cores / plan.local_workers);
  plan.why =
      absl::StrCat(plan.cores, plan.cores == 1 ? " core" : " cores",
                   *limit > 0 && *limit < in.affinity_cpus ? " (cgroup CPU limit)" : "", " / ",
                   plan.local_workers, plan.local_workers == 1 ? " worker" : " workers",
                   " on this host", in.local_world_size.empty() ? "" : " (LOCAL_WORLD_SIZE)");
  if (plan.local_workers > plan.cores) {
    absl::StrAppend(&plan.why, "; more workers than cores, so they share them");
  }
  return plan;
}

}  // namespace trainstep
