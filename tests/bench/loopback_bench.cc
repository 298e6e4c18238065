// Window round trip over real gRPC on 127.0.0.1: W simulated ranks (threads) report
// BeginWindow then CompleteWindow with no compute in between; each rank times
// "send BeginWindow → hold the decision". The coordinator runs in this process with its
// journal in a temp dir (fsync on every decision).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <filesystem>
#include <thread>

#include "absl/strings/str_cat.h"
#include "coordinator/coordinator.h"
#include "coordinator/server.h"
#include "tests/integration/simulated_worker.h"
#include "trainstep/v1/job_service.grpc.pb.h"

namespace trainstep {
namespace {

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(q * (v.size() - 1) + 0.5));
  return v[i];
}

void BM_LoopbackWindow(benchmark::State& state) {
  const int world = static_cast<int>(state.range(0));
  const int64_t windows = state.range(1);
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / absl::StrCat("trainstep-bench-", getpid());
  std::vector<double> latencies;
  for (auto _ : state) {
    state.PauseTiming();
    std::filesystem::remove_all(dir);
    CoordinatorOptions options;
    options.state_dir = dir.string();
    std::unique_ptr<Coordinator> c = std::move(*Coordinator::Open(options));
    std::unique_ptr<CoordinatorServer> s =
        std::move(*CoordinatorServer::Start(c.get(), "127.0.0.1:0"));
    const std::string address = absl::StrCat("127.0.0.1:", s->port());
    auto jobs = v1::JobService::NewStub(MakeChannel(address));
    grpc::ClientContext ctx;
    v1::SubmitJobRequest req;
    req.set_spec_json(absl::StrCat(
        R"({"model":{"mlp":{}},"data":{"synthetic_regression":{"samples":)", world * windows,
        R"(}},"batch":{"micro_batch_size":1},"workers":{"count":)", world, "}}"));
    v1::Job job;
    (void)jobs->SubmitJob(&ctx, req, &job);
    std::vector<std::unique_ptr<testing::SimulatedWorker>> workers;
    for (int r = 0; r < world; ++r) {
      workers.push_back(std::make_unique<testing::SimulatedWorker>(
          address, job.job_id(), world * windows,
          [](int64_t, int) { return testing::SimReport{}; }));
      (void)workers.back()->Register(absl::StrCat("bench-", r));
    }
    state.ResumeTiming();
    std::vector<std::thread> threads;
    for (auto& w : workers) threads.emplace_back([&w] { (void)w->Run(); });
    for (std::thread& t : threads) t.join();
    state.PauseTiming();
    for (auto& w : workers) {
      w->StopHeartbeats();
      for (double x : w->window_seconds()) latencies.push_back(x);
    }
    workers.clear();
    s.reset();
    c.reset();
    std::filesystem::remove_all(dir);
    state.ResumeTiming();
  }
  state.counters["windows_per_s"] = benchmark::Counter(
      static_cast<double>(state.iterations() * windows), benchmark::Counter::kIsRate);
  state.counters["p50_ms"] = Percentile(latencies, 0.50) * 1e3;
  state.counters["p99_ms"] = Percentile(latencies, 0.99) * 1e3;
}
// The baseline of the same run: one client making two plain unary calls (ListJobs) in a
// row — what a window costs a rank at the least (BeginWindow + CompleteWindow), with no
// barrier, no other ranks and no journal.
void BM_TwoUnaryCalls(benchmark::State& state) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / absl::StrCat("trainstep-bench-rpc-", getpid());
  std::filesystem::remove_all(dir);
  CoordinatorOptions options;
  options.state_dir = dir.string();
  std::unique_ptr<Coordinator> c = std::move(*Coordinator::Open(options));
  std::unique_ptr<CoordinatorServer> s =
      std::move(*CoordinatorServer::Start(c.get(), "127.0.0.1:0"));
  auto jobs = v1::JobService::NewStub(MakeChannel(absl::StrCat("127.0.0.1:", s->port())));
  std::vector<double> latencies;
  for (auto _ : state) {
    const absl::Time start = absl::Now();
    for (int i = 0; i < 2; ++i) {
      grpc::ClientContext ctx;
      v1::ListJobsResponse resp;
      (void)jobs->ListJobs(&ctx, v1::ListJobsRequest(), &resp);
    }
    latencies.push_back(absl::ToDoubleSeconds(absl::Now() - start));
  }
  state.counters["p50_ms"] = Percentile(latencies, 0.50) * 1e3;
  state.counters["p99_ms"] = Percentile(latencies, 0.99) * 1e3;
  s.reset();
  c.reset();
  std::filesystem::remove_all(dir);
}
BENCHMARK(BM_TwoUnaryCalls)->Iterations(2000)->Unit(benchmark::kMicrosecond);

BENCHMARK(BM_LoopbackWindow)
    ->Args({8, 500})
    ->Args({64, 100})
    ->Iterations(3)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace trainstep

BENCHMARK_MAIN();
