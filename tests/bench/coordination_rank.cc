// One process of tests/bench/coordination_bench.py, the window round trip with ranks as
// separate processes. Three modes:
//   --submit: submits the benchmark's job (W ranks, --windows windows) and prints its id;
//   --job ID: one simulated rank (tests/integration/simulated_worker.h, the real
//     WorkerService protocol) that registers, runs every window and writes, for the windows
//     after --skip, the round in seconds (from holding the previous window's decision to
//     holding this one's: BeginWindow then CompleteWindow, or with --pipeline_begin, as the
//     real worker's default, one CompleteWindow carrying the next window's begin report) and
//     this process's CPU seconds over them;
//   --unary N: N plain unary calls (ListJobs) in a row, each timed: the gRPC round trip alone.
// Results go to --out as one JSON object.
#include <time.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/channel.h"
#include "tests/integration/simulated_worker.h"
#include "trainstep/v1/job_service.grpc.pb.h"

ABSL_FLAG(std::string, address, "127.0.0.1:7070", "the coordinator's gRPC address");
ABSL_FLAG(bool, submit, false, "submit the job and print its id");
ABSL_FLAG(int32_t, world, 2, "--submit: ranks of the job");
ABSL_FLAG(int64_t, windows, 100, "--submit: windows of the job (warm-up included)");
ABSL_FLAG(std::string, job, "", "run one rank of this job");
ABSL_FLAG(std::string, name, "rank", "--job: this rank's worker name");
ABSL_FLAG(int64_t, samples, 0, "--job: the dataset size the rank reports (world × windows)");
ABSL_FLAG(bool, pipeline_begin, true,
          "--job: the next window's begin report rides on each CompleteWindow (one call per "
          "window), as the worker's --pipeline-begin does");
ABSL_FLAG(int64_t, skip, 0, "--job, --unary: leading windows or calls left out (warm-up)");
ABSL_FLAG(int64_t, unary, 0, "make this many ListJobs calls, each timed");
ABSL_FLAG(std::string, out, "", "write the JSON result here (default: stdout)");

namespace trainstep {
namespace {

double CpuSeconds() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

int Write(const std::string& json) {
  const std::string path = absl::GetFlag(FLAGS_out);
  if (path.empty()) {
    std::cout << json << "\n";
    return 0;
  }
  std::ofstream f(path);
  f << json << "\n";
  return f.good() ? 0 : 1;
}

std::string Result(const std::vector<double>& seconds, double cpu_s, double wall_s) {
  return absl::StrCat(R"({"seconds":[)", absl::StrJoin(seconds, ","), R"(],"cpu_s":)", cpu_s,
                      R"(,"wall_s":)", wall_s, "}");
}

int Submit() {
  auto jobs = v1::JobService::NewStub(MakeChannel(absl::GetFlag(FLAGS_address)));
  const int world = absl::GetFlag(FLAGS_world);
  // One sample per rank and window; no checkpoint within the run (rank 0's AckCheckpoint
  // is not part of the coordination round).
  v1::SubmitJobRequest req;
  req.set_spec_json(absl::StrCat(
      R"({"name":"coordination-bench","model":{"mlp":{}},"data":{"synthetic_regression":{"samples":)",
      world * absl::GetFlag(FLAGS_windows),
      R"(}},"batch":{"micro_batch_size":1},"checkpoint":{"every_updates":1000000000},)",
      R"("workers":{"count":)", world, "}}"));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  ctx.set_wait_for_ready(true);
  v1::Job job;
  const grpc::Status s = jobs->SubmitJob(&ctx, req, &job);
  if (!s.ok()) {
    std::cerr << "SubmitJob: " << s.error_message() << "\n";
    return 1;
  }
  std::cout << job.job_id() << "\n";
  return 0;
}

int RunRank() {
  const int64_t skip = absl::GetFlag(FLAGS_skip);
  int64_t reports = 0;
  double cpu0 = 0.0;
  absl::Time wall0;
  // Called once per window, when its begin report is made (with --pipeline_begin, while the
  // window before completes): the timed part starts at window `skip`.
  testing::ReportFn report = [&](int64_t, int) {
    if (reports++ == skip) {
      cpu0 = CpuSeconds();
      wall0 = absl::Now();
    }
    return testing::SimReport{};
  };
  testing::SimulatedWorker w(absl::GetFlag(FLAGS_address), absl::GetFlag(FLAGS_job),
                             absl::GetFlag(FLAGS_samples), report);
  w.set_pipeline_begin(absl::GetFlag(FLAGS_pipeline_begin));
  if (absl::Status s = w.Register(absl::GetFlag(FLAGS_name)); !s.ok()) {
    std::cerr << "Register: " << s << "\n";
    return 1;
  }
  if (absl::Status s = w.Run(); !s.ok()) {
    std::cerr << "Run: " << s << "\n";
    return 1;
  }
  const double cpu_s = CpuSeconds() - cpu0;
  const double wall_s = absl::ToDoubleSeconds(absl::Now() - wall0);
  w.StopHeartbeats();
  std::vector<double> seconds = w.window_seconds();
  if (static_cast<int64_t>(seconds.size()) <= skip) {
    std::cerr << "only " << seconds.size() << " windows decided, --skip " << skip << "\n";
    return 1;
  }
  seconds.erase(seconds.begin(), seconds.begin() + skip);
  return Write(Result(seconds, cpu_s, wall_s));
}

int RunUnary() {
  auto jobs = v1::JobService::NewStub(MakeChannel(absl::GetFlag(FLAGS_address)));
  const int64_t n = absl::GetFlag(FLAGS_unary);
  const int64_t skip = absl::GetFlag(FLAGS_skip);
  std::vector<double> seconds;
  double cpu0 = CpuSeconds();
  absl::Time wall0 = absl::Now();
  for (int64_t i = 0; i < skip + n; ++i) {
    if (i == skip) {
      cpu0 = CpuSeconds();
      wall0 = absl::Now();
    }
    const absl::Time start = absl::Now();
    grpc::ClientContext ctx;
    v1::ListJobsResponse resp;
    const grpc::Status s = jobs->ListJobs(&ctx, v1::ListJobsRequest(), &resp);
    if (!s.ok()) {
      std::cerr << "ListJobs: " << s.error_message() << "\n";
      return 1;
    }
    if (i >= skip) seconds.push_back(absl::ToDoubleSeconds(absl::Now() - start));
  }
  return Write(Result(seconds, CpuSeconds() - cpu0, absl::ToDoubleSeconds(absl::Now() - wall0)));
}

}  // namespace
}  // namespace trainstep

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "one process of tests/bench/coordination_bench.py: --submit, --job ID or --unary N");
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_submit)) return trainstep::Submit();
  if (absl::GetFlag(FLAGS_unary) > 0) return trainstep::RunUnary();
  if (!absl::GetFlag(FLAGS_job).empty()) return trainstep::RunRank();
  std::cerr << "one of --submit, --job or --unary is needed\n";
  return 2;
}
