// Real worker processes on the BLAS implementations a Debian host may have as libblas.so.3:
// each starts (its /metrics server included), trains, and reports the library it really
// loaded. Plus the start-up notices about threads and bf16. With OpenBLAS as the
// system BLAS every worker exited at start ("null context when constructing CivetServer").
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/env.h"
#include "tests/integration/cluster_test.h"

namespace trainstep {
namespace {

constexpr char kLibDir[] = "/usr/lib/x86_64-linux-gnu";

std::string ReadFile(const std::string& path) {
  return Env::Default()->ReadFile(path).value_or("");
}

// The first line of `log` that contains `needle`, or "".
std::string LineWith(const std::string& log, absl::string_view needle) {
  std::istringstream in(log);
  for (std::string line; std::getline(in, line);) {
    if (absl::StrContains(line, needle)) return line;
  }
  return "";
}

class WorkerBlasTest : public testing::ClusterTest {
 protected:
  WorkerBlasTest() : ClusterTest("trainstep-blas-") {}

  // A small fp32 mlp job (its Linear layers are BLAS GEMMs) on two workers started with
  // LD_LIBRARY_PATH = `library_path` ("": the system's libblas.so.3); expects success and
  // returns the two workers' logs.
  std::vector<std::string> TrainTwoWorkers(const std::string& library_path) {
    if (library_path.empty()) {
      unsetenv("LD_LIBRARY_PATH");
    } else {
      setenv("LD_LIBRARY_PATH", library_path.c_str(), 1);
    }
    absl::StatusOr<std::string> id = cluster_->Submit(
        R"({"name":"blas","seed":3,"model":{"mlp":{"hidden":64}},)"
        R"("data":{"synthetic_regression":{"samples":96,"in_features":8}},)"
        R"("batch":{"micro_batch_size":4,"accumulation_steps":3},"workers":{"count":2},)"
        R"("optimizer":{"sgd":{"lr":0.05}},"stop":{"max_updates":4}})");
    EXPECT_TRUE(id.ok()) << id.status();
    if (!id.ok()) return {};
    for (int i = 0; i < 2; ++i) EXPECT_TRUE(cluster_->StartWorker(*id).ok());
    absl::StatusOr<v1::Job> job = cluster_->WaitForJob(*id, absl::Seconds(120));
    EXPECT_TRUE(job.ok()) << job.status();
    if (job.ok()) EXPECT_EQ(job->state(), v1::SUCCEEDED) << job->message() << cluster_->Logs();
    EXPECT_EQ(cluster_->WaitForWorkers(absl::Seconds(30)), (std::vector<int>{0, 0}))
        << cluster_->Logs();
    return {ReadFile(dir_ + "/worker-0.log"), ReadFile(dir_ + "/worker-1.log")};
  }

  // Each worker's start-up line names `kind` and a library in `dir`.
  void ExpectBlas(const std::vector<std::string>& logs, const std::string& kind,
                  const std::string& dir) {
    ASSERT_EQ(logs.size(), 2u);
    for (const std::string& log : logs) {
      const std::string line = LineWith(log, "blas: ");
      EXPECT_TRUE(absl::StrContains(line, absl::StrCat("blas: ", kind))) << log;
      EXPECT_TRUE(absl::StrContains(line, absl::StrCat("(", dir, "/"))) << log;
    }
  }

  // OpenBLAS's `build` ("openmp": the one install-deps.sh makes libblas.so.3; "pthread")
  // chosen for the workers alone: proves the fix on a machine whose alternative still points at
  // the reference BLAS, for each build's static TLS.
  void ExpectWorkersTrainWithOpenBlasBuild(const std::string& build) {
    const std::string dir = absl::StrCat(kLibDir, "/openblas-", build);
    // scripts/install-deps.sh installs both builds, so `make test` always runs this; the
    // Debian 13 root of `make check-gpu-build` carries only what the CUDA build needs.
    if (!std::filesystem::exists(dir + "/libblas.so.3")) {
      GTEST_SKIP() << "libopenblas0-" << build
                   << " is not installed here (scripts/install-deps.sh installs it)";
    }
    const std::vector<std::string> logs = TrainTwoWorkers(dir);
    ExpectBlas(logs, "OpenBLAS", dir);
    for (const std::string& log : logs) {
      EXPECT_TRUE(absl::StrContains(LineWith(log, "blas: "), absl::StrCat("(", build, ")"))) << log;
    }
  }
};

// Whatever the libblas.so.3 alternative points at (OpenBLAS in CI: scripts/install-deps.sh
// sets it), the workers train with it and report that very library. Catches: the
// start-up failure under OpenBLAS; a BLAS reported from a guess instead of the process.
TEST_F(WorkerBlasTest, WorkersTrainWithTheSystemBlas) {
  const std::filesystem::path dir =
      std::filesystem::canonical(absl::StrCat(kLibDir, "/libblas.so.3")).parent_path();
  const bool openblas = absl::StartsWith(dir.filename().string(), "openblas");
  ExpectBlas(TrainTwoWorkers(""), openblas ? "OpenBLAS" : "reference BLAS", dir.string());
}

TEST_F(WorkerBlasTest, WorkersTrainWithOpenBlasOpenMpBuild) {
  ExpectWorkersTrainWithOpenBlasBuild("openmp");
}

TEST_F(WorkerBlasTest, WorkersTrainWithOpenBlasPthreadBuild) {
  ExpectWorkersTrainWithOpenBlasBuild("pthread");
}

// The reference BLAS, chosen with LD_LIBRARY_PATH: still trains, and the worker warns that
// its fp32 GEMMs are slow. Catches: a fix that only works with OpenBLAS; a silent slow BLAS.
TEST_F(WorkerBlasTest, WorkersTrainWithTheReferenceBlasAndWarn) {
  const std::string blas = absl::StrCat(kLibDir, "/blas");
  const std::string lapack = absl::StrCat(kLibDir, "/lapack");
  ASSERT_TRUE(std::filesystem::exists(blas + "/libblas.so.3")) << "libblas3 is not installed";
  const std::vector<std::string> logs = TrainTwoWorkers(absl::StrCat(blas, ":", lapack));
  ExpectBlas(logs, "reference BLAS", blas);
  for (const std::string& log : logs) {
    EXPECT_FALSE(LineWith(log, "WARN fp32 matrix products run on the reference BLAS").empty())
        << log;
  }
}

// Two workers on one host (LOCAL_WORLD_SIZE=2, as deploy/local/launch.sh sets it) split its
// cores. Catches: every worker taking every core, so two of them oversubscribe the host.
TEST_F(WorkerBlasTest, LocalWorkersSplitTheCores) {
  setenv("LOCAL_WORLD_SIZE", "2", 1);
  unsetenv("OMP_NUM_THREADS");
  const std::vector<std::string> logs = TrainTwoWorkers("");
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  const int expected = std::max(1, CPU_COUNT(&set) / 2);
  for (const std::string& log : logs) {
    EXPECT_TRUE(
        absl::StrContains(LineWith(log, "blas: "), absl::StrCat("threads: ", expected, " (")))
        << log;
    EXPECT_TRUE(absl::StrContains(LineWith(log, "blas: "), "(LOCAL_WORLD_SIZE)")) << log;
  }
}

// A bf16 job: the worker told its CPU lacks native bf16 warns with the reason and the
// measured cost; the one told it has avx512_bf16 just notes it. Catches: bf16 silently
// emulated at many times the fp32 cost (the demo took 57 minutes instead of 3).
TEST_F(WorkerBlasTest, Bf16JobWarnsWhereBf16IsEmulated) {
  const std::string text = dir_ + "/text.txt";
  {
    std::ofstream out(text);
    for (int i = 0; i < 40; ++i) out << "the quick brown fox jumps over the lazy dog. ";
  }
  const std::string no_bf16 = dir_ + "/cpuinfo-avx2";
  const std::string bf16 = dir_ + "/cpuinfo-bf16";
  std::ofstream(no_bf16) << "processor\t: 0\nmodel name\t: AVX2 CPU\nflags\t\t: avx2 fma\n";
  std::ofstream(bf16) << "processor\t: 0\nmodel name\t: BF16 CPU\nflags\t\t: avx2 avx512_bf16\n";
  absl::StatusOr<std::string> id = cluster_->Submit(absl::StrCat(
      R"({"name":"gpt","model":{"tiny_gpt":{"n_layer":1,"n_head":2,"d_model":32}},)",
      R"("data":{"text":{"paths":[")", text, R"("],"seq_len":32}},"precision":"bf16",)",
      R"("batch":{"micro_batch_size":4,"accumulation_steps":1},"workers":{"count":2},)",
      R"("optimizer":{"adamw":{"lr":0.001}},"stop":{"max_updates":2}})"));
  ASSERT_TRUE(id.ok()) << id.status();
  ASSERT_TRUE(cluster_->StartWorker(*id, {"--debug-cpuinfo=" + no_bf16}).ok());
  ASSERT_TRUE(cluster_->StartWorker(*id, {"--debug-cpuinfo=" + bf16}).ok());
  absl::StatusOr<v1::Job> job = cluster_->WaitForJob(*id, absl::Seconds(120));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::SUCCEEDED) << job->message() << cluster_->Logs();

  const std::string emulated = LineWith(ReadFile(dir_ + "/worker-0.log"), "precision bf16");
  EXPECT_TRUE(absl::StrContains(emulated, "WARN")) << emulated;
  EXPECT_TRUE(absl::StrContains(emulated, "AVX2 CPU has no avx512_bf16 or amx_bf16")) << emulated;
  EXPECT_TRUE(absl::StrContains(emulated, "x its fp32 time under bf16 autocast")) << emulated;
  const std::string native = LineWith(ReadFile(dir_ + "/worker-1.log"), "precision bf16");
  EXPECT_TRUE(absl::StrContains(native, "INFO precision bf16: native on this CPU (avx512_bf16)"))
      << native;
}

}  // namespace
}  // namespace trainstep
