// worker/thread_stack.cc: in a process that loads LibTorch (with CUDA: ~160 KB of static TLS),
// the worker's /metrics server starts, and small stack requests are raised.
#include <gtest/gtest.h>
#include <pthread.h>
#include <torch/torch.h>

#include "worker/metrics.h"

namespace trainstep {
namespace {

// Catches: a stack request left below what the loaded libraries' static TLS needs.
TEST(ThreadStackTest, SmallRequestsAreRaised) {
  pthread_attr_t attr;
  ASSERT_EQ(pthread_attr_init(&attr), 0);
  ASSERT_EQ(pthread_attr_setstacksize(&attr, 100 * 1024), 0);
  size_t size = 0;
  ASSERT_EQ(pthread_attr_getstacksize(&attr, &size), 0);
  EXPECT_GE(size, size_t{1} << 20);
  ASSERT_EQ(pthread_attr_setstacksize(&attr, 16 << 20), 0);  // larger ones stay
  ASSERT_EQ(pthread_attr_getstacksize(&attr, &size), 0);
  EXPECT_EQ(size, size_t{16} << 20);
  pthread_attr_destroy(&attr);
}

// Catches: "null context when constructing CivetServer" — civetweb's 100 KB worker threads
// failing to start next to LibTorch's libraries (CUDA's, or OpenBLAS as the system BLAS).
TEST(ThreadStackTest, MetricsServerStartsInALibTorchProcess) {
  at::Tensor t = torch::ones({2});  // LibTorch is loaded and used
  absl::StatusOr<std::unique_ptr<WorkerMetrics>> m = WorkerMetrics::Start("127.0.0.1:0");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_GT((*m)->port(), 0);
  EXPECT_EQ(t.sum().item<float>(), 2.0f);
}

}  // namespace
}  // namespace trainstep
