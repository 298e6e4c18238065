#include "worker/host/bf16_probe.h"

#include <ATen/ATen.h>
#include <torch/csrc/api/include/torch/utils.h>

#include <algorithm>
#include <chrono>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/log.h"
#include "worker/train/amp.h"
#include "worker/train/torch_status.h"

namespace trainstep {
namespace {

// Best of `reps` after `warmup` calls: oneDNN builds its kernels, and LibTorch's OpenMP pool
// its threads, on the first calls (14 ms a call for the first few with 2 threads, 0.07 ms
// after, on the machine of BENCHMARKS.md).
template <typename Fn>
double BestSeconds(int warmup, int reps, Fn&& fn) {
  for (int i = 0; i < warmup; ++i) fn();
  double best = std::numeric_limits<double>::infinity();
  for (int i = 0; i < reps; ++i) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    best = std::min(
        best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return best;
}

std::string Ms(double seconds) { return absl::StrFormat("%.2f ms", seconds * 1e3); }

}  // namespace

absl::StatusOr<Bf16Cost> MeasureBf16Cost() {
  Bf16Cost cost;
  absl::Status s = CatchTorch(absl::StatusCode::kInternal, "measuring bf16 against fp32", [&] {
    torch::NoGradGuard no_grad;  // at::NoGradGuard is not in ATen.h on LibTorch 2.x
    const at::Tensor x = at::randn({64, 256});
    const at::Tensor w = at::randn({256, 256});
    const at::Tensor b = at::randn({256});
    // Where bf16 is emulated a call takes ~5 ms: 8 of them stay well under 100 ms.
    constexpr int kWarmup = 3, kReps = 5;
    cost.fp32_seconds = BestSeconds(kWarmup, kReps, [&] { (void)at::linear(x, w, b); });
    cost.bf16_seconds = BestSeconds(kWarmup, kReps, [&] {
      AutocastScope autocast(v1::JobSpec::bf16, at::kCPU);
      (void)at::linear(x, w, b);
    });
  });
  if (!s.ok()) return s;
  return cost;
}

std::string Bf16Notice(const CpuInfo& cpu, const absl::StatusOr<Bf16Cost>& cost, bool* emulated) {
  const std::vector<std::string> flags = NativeBf16Flags(cpu);
  *emulated = flags.empty();
  std::string measured;
  if (!cost.ok()) {
    measured = absl::StrCat("(the start-up measurement failed: ", cost.status().message(), ")");
  } else {
    const double ratio = cost->bf16_seconds / std::max(cost->fp32_seconds, 1e-9);
    measured = absl::StrFormat(
        "a Linear(256, 256) on 64 rows took %.1fx its fp32 time under bf16 autocast here (%s "
        "against %s)",
        ratio, Ms(cost->bf16_seconds), Ms(cost->fp32_seconds));
  }
  if (!*emulated) {
    return absl::StrCat("precision bf16: native on this CPU (", absl::StrJoin(flags, ", "), "); ",
                        measured);
  }
  return absl::StrCat(
      "precision bf16 on a CPU without native bf16 (", cpu.model.empty() ? "unknown" : cpu.model,
      " has no avx512_bf16 or amx_bf16 in /proc/cpuinfo): LibTorch emulates bf16 arithmetic "
      "here; ",
      measured, ". Use precision fp32 on this CPU, or run bf16 jobs on CPUs with native bf16");
}

void LogBf16Notice(const CpuInfo& cpu) {
  bool emulated = false;
  const std::string notice = Bf16Notice(cpu, MeasureBf16Cost(), &emulated);
  if (emulated) {
    LogWarning(notice);
  } else {
    LogInfo(notice);
  }
}

}  // namespace trainstep
