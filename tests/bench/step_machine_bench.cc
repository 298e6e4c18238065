// Decisions per second of the pure step machine: one iteration = one window, all W ranks
// reporting BeginWindow then CompleteWindow, no gRPC, no journal I/O.
#include <benchmark/benchmark.h>

#include "absl/strings/str_cat.h"
#include "coordinator/step_machine.h"
#include "core/spec.h"

namespace trainstep {
namespace {

void BM_DecideWindow(benchmark::State& state) {
  const int world = static_cast<int>(state.range(0));
  absl::StatusOr<v1::JobSpec> spec = ParseAndResolveJobSpec(
      absl::StrCat(R"({"model":{"mlp":{}},"data":{"synthetic_regression":{"samples":100000000}},)",
                   R"("batch":{"micro_batch_size":1},"workers":{"count":)", world, "}}"));
  if (!spec.ok()) {
    state.SkipWithError(std::string(spec.status().message()).c_str());
    return;
  }
  v1::Job job;
  job.set_job_id("job-1");
  job.set_state(v1::PENDING);
  *job.mutable_spec() = *spec;
  absl::Time now = absl::FromUnixSeconds(1'700'000'000);
  std::unique_ptr<StepMachine> m = StepMachine::Create(MachineOptions(), job, now);
  std::vector<std::string> ids;
  for (int r = 0; r < world; ++r) {
    ids.push_back(absl::StrCat("w-", r + 1));
    v1::RegisterWorkerRequest reg;
    (void)m->RegisterWorker(ids.back(), reg, now);
    v1::HeartbeatRequest hb;
    hb.set_worker_id(ids.back());
    hb.mutable_dataset()->set_samples(100000000);
    (void)m->Heartbeat(hb, now);
  }
  m->TakeRecords();
  const int64_t generation = m->Job().progress().generation();
  int64_t window = 1;
  for (auto _ : state) {
    for (int r = 0; r < world; ++r) {
      v1::BeginWindowRequest b;
      b.set_worker_id(ids[r]);
      b.set_generation(generation);
      b.set_window_id(window);
      b.set_rank(r);
      b.set_valid_units(100);
      benchmark::DoNotOptimize(m->BeginWindow(b, now));
    }
    for (int r = 0; r < world; ++r) {
      v1::CompleteWindowRequest c;
      c.set_worker_id(ids[r]);
      c.set_generation(generation);
      c.set_window_id(window);
      c.set_rank(r);
      c.set_valid_units(100);
      c.set_loss_sum(250.0);
      c.set_grad_norm(1.5);
      c.set_micro_steps(4);
      c.set_allreduce_calls(1);
      benchmark::DoNotOptimize(m->CompleteWindow(c, now));
    }
    benchmark::DoNotOptimize(m->TakeRecords());
    ++window;
  }
  if (m->Job().progress().optimizer_update_id() != window - 1) {
    state.SkipWithError("a window did not commit");
  }
  state.counters["decisions_per_s"] =
      benchmark::Counter(static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
  state.counters["reports_per_s"] = benchmark::Counter(
      static_cast<double>(state.iterations()) * 2 * world, benchmark::Counter::kIsRate);
}
BENCHMARK(BM_DecideWindow)->Arg(8)->Arg(64)->Arg(1024)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace trainstep

BENCHMARK_MAIN();
