// The worker's start-up view of its host: the BLAS it really loaded, the threads it applied,
// and the lines and JSON it reports them in.
#include "worker/host/host_setup.h"

#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace trainstep {
namespace {

HostSetup Fixture(bool native_bf16, BlasLibrary::Kind blas) {
  HostSetup h;
  h.cpu = ParseCpuInfo(absl::StrCat("processor\t: 0\nmodel name\t: Test CPU\nflags\t: avx2",
                                    native_bf16 ? " avx512_bf16" : "", "\n"));
  h.blas.kind = blas;
  h.blas.path = blas == BlasLibrary::Kind::kReference ? "/usr/lib/blas/libblas.so.3.11.0"
                                                      : "/usr/lib/openblas-pthread/libopenblasp.so";
  h.threads.threads = 1;
  h.threads.cores = 2;
  h.threads.local_workers = 2;
  h.threads.why = "2 cores / 2 workers on this host (LOCAL_WORLD_SIZE)";
  return h;
}

// Catches: the start-up line missing what the issue asks for (BLAS, threads, native bf16).
TEST(HostSetupTest, DescribeHostNamesCpuBf16BlasAndThreads) {
  const std::string line = DescribeHost(Fixture(false, BlasLibrary::Kind::kOpenBlas));
  EXPECT_NE(line.find("Test CPU"), std::string::npos) << line;
  EXPECT_NE(line.find("native bf16: no"), std::string::npos) << line;
  EXPECT_NE(line.find("blas: OpenBLAS"), std::string::npos) << line;
  EXPECT_NE(line.find("/usr/lib/openblas-pthread/libopenblasp.so"), std::string::npos) << line;
  EXPECT_NE(line.find("threads: 1 (2 cores / 2 workers"), std::string::npos) << line;
  EXPECT_NE(DescribeHost(Fixture(true, BlasLibrary::Kind::kOpenBlas))
                .find("native bf16: yes (avx512_bf16)"),
            std::string::npos);
}

// Catches: the reference BLAS or oversubscription going unmentioned.
TEST(HostSetupTest, WarnsAboutTheReferenceBlasAndOversubscription) {
  EXPECT_TRUE(HostWarnings(Fixture(true, BlasLibrary::Kind::kOpenBlas)).empty());
  std::vector<std::string> w = HostWarnings(Fixture(true, BlasLibrary::Kind::kReference));
  ASSERT_EQ(w.size(), 1u);
  EXPECT_NE(w[0].find("reference BLAS"), std::string::npos) << w[0];
  EXPECT_NE(w[0].find("libopenblas0-openmp"), std::string::npos) << w[0];
  HostSetup over = Fixture(true, BlasLibrary::Kind::kOpenBlas);
  over.threads.threads = 8;
  w = HostWarnings(over);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_NE(w[0].find("oversubscribe"), std::string::npos) << w[0];
}

// Catches: OpenBLAS's pthread build running a second thread pool beside LibTorch's with more
// than one thread (0.25x of the OpenMP build's tokens/s here) without a word.
TEST(HostSetupTest, WarnsAboutOpenBlasOwnPoolOnlyWithSeveralThreads) {
  HostSetup h = Fixture(true, BlasLibrary::Kind::kOpenBlas);
  h.blas_own_pool = true;
  EXPECT_TRUE(HostWarnings(h).empty()) << "one thread: the pools cannot contend";
  h.threads.threads = 2;
  std::vector<std::string> w = HostWarnings(h);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_NE(w[0].find("pthread build"), std::string::npos) << w[0];
  EXPECT_NE(w[0].find("libopenblas0-openmp"), std::string::npos) << w[0];
  h.blas_own_pool = false;
  EXPECT_TRUE(HostWarnings(h).empty()) << "the OpenMP build shares LibTorch's pool";
}

// Catches: demo.sh's `"native_bf16": true|false` field renamed or malformed.
TEST(HostSetupTest, HostJsonCarriesTheFieldsScriptsRead) {
  const std::string json = HostJson(Fixture(true, BlasLibrary::Kind::kOpenBlas));
  EXPECT_NE(json.find("\"native_bf16\": true"), std::string::npos) << json;
  EXPECT_NE(json.find("\"native_bf16_flags\": [\"avx512_bf16\"]"), std::string::npos) << json;
  EXPECT_NE(json.find("\"blas\": \"OpenBLAS\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"threads\": 1"), std::string::npos) << json;
  EXPECT_NE(HostJson(Fixture(false, BlasLibrary::Kind::kOpenBlas)).find("\"native_bf16\": false"),
            std::string::npos);
}

// Catches a worker that dies with its peer: a collective's write to the dead peer's socket
// raised SIGPIPE, whose default action killed the survivor (seen in a chaos campaign: a rank's
// SIGKILL took a second rank with it).
TEST(HostSetupTest, SetUpHostLeavesBrokenPipesToTheWrite) {
  ASSERT_EQ(setenv("LOCAL_WORLD_SIZE", "1", 1), 0);
  signal(SIGPIPE, SIG_DFL);
  ASSERT_TRUE(SetUpHost(/*threads_flag=*/1, "").ok());
  struct sigaction now {};
  ASSERT_EQ(sigaction(SIGPIPE, nullptr, &now), 0);
  EXPECT_EQ(now.sa_handler, SIG_IGN);
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  close(fds[0]);
  errno = 0;
  EXPECT_EQ(write(fds[1], "x", 1), -1);  // this process is still here to see the error
  EXPECT_EQ(errno, EPIPE);
  close(fds[1]);
}

// The real thing in this process: the BLAS found is the one libblas.so.3 resolves to (the
// Debian alternative, or LD_LIBRARY_PATH), and the planned thread count is what LibTorch uses.
// Catches: a BLAS guessed from the alternative instead of read from the process; threads
// planned but never applied.
TEST(HostSetupTest, SetUpHostReportsTheLoadedBlasAndAppliesThreads) {
  ASSERT_EQ(setenv("LOCAL_WORLD_SIZE", "1", 1), 0);
  ASSERT_EQ(unsetenv("OMP_NUM_THREADS"), 0);
  absl::StatusOr<HostSetup> h = SetUpHost(/*threads_flag=*/1, "");
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->threads.threads, 1);
  EXPECT_EQ(at::get_num_threads(), 1);
  EXPECT_GT(h->cpu.logical_cpus, 0);
  ASSERT_NE(h->blas.kind, BlasLibrary::Kind::kNone) << "LibTorch links libblas.so.3";
  // Which libblas.so.3 the loader took: the first LD_LIBRARY_PATH entry that has one, else
  // the system's (the alternatives symlink).
  std::string libblas = "/usr/lib/x86_64-linux-gnu/libblas.so.3";
  if (const char* lp = getenv("LD_LIBRARY_PATH")) {
    for (absl::string_view dir : absl::StrSplit(lp, ':', absl::SkipEmpty())) {
      const std::string candidate = absl::StrCat(dir, "/libblas.so.3");
      if (std::filesystem::exists(candidate)) {
        libblas = candidate;
        break;
      }
    }
  }
  const std::filesystem::path expected = std::filesystem::canonical(libblas).parent_path();
  EXPECT_EQ(std::filesystem::path(h->blas.path).parent_path(), expected) << DescribeHost(*h);
  if (expected.filename().string().rfind("openblas", 0) == 0) {
    EXPECT_EQ(h->blas.kind, BlasLibrary::Kind::kOpenBlas);
    // OpenBLAS's own answer (openblas_get_parallel) agrees with the folder it came from.
    const std::string threading = expected.filename() == "openblas-openmp"    ? "(openmp)"
                                  : expected.filename() == "openblas-pthread" ? "(pthread)"
                                                                              : "(";
    EXPECT_NE(h->blas_config.find(threading), std::string::npos) << h->blas_config;
  } else if (expected.filename() == "blas") {
    EXPECT_EQ(h->blas.kind, BlasLibrary::Kind::kReference);
  }
}

}  // namespace
}  // namespace trainstep
