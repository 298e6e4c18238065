// Fixed-size thread stacks still fit the process's static TLS (worker/host/thread_stack.h): the
// metrics server (civetweb, 100 KiB stacks) starts whatever BLAS LibTorch loaded.
#include "worker/host/thread_stack.h"

#include <alloca.h>
#include <gtest/gtest.h>
#include <link.h>
#include <pthread.h>
#include <torch/torch.h>

#include <cstring>

#include "worker/metrics.h"

namespace trainstep {
namespace {

size_t TlsSegmentBytes() {
  size_t total = 0;
  dl_iterate_phdr(
      [](struct dl_phdr_info* info, size_t, void* out) {
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          if (info->dlpi_phdr[i].p_type == PT_TLS) {
            *static_cast<size_t*>(out) += info->dlpi_phdr[i].p_memsz;
          }
        }
        return 0;
      },
      &total);
  return total;
}

void* TouchStack(void* arg) {
  // Use most of the requested stack, as a real thread may: a stack that lost its TLS share
  // to glibc would overflow here.
  const size_t bytes = *static_cast<size_t*>(arg) * 3 / 4;
  volatile char* buf = static_cast<volatile char*>(alloca(bytes));
  for (size_t i = 0; i < bytes; i += 512) buf[i] = 1;
  return nullptr;
}

// Catches: the interposer missing from the binary (not linked or not exported), so glibc
// takes the static TLS out of the requested size and pthread_create fails with EINVAL.
TEST(ThreadStackTest, ARequestedStackOfTheTlsSizeStillStartsAndIsUsable) {
  size_t request = TlsSegmentBytes();
  ASSERT_GE(request, static_cast<size_t>(PTHREAD_STACK_MIN))
      << "LibTorch's libraries carry tens of KiB of static TLS";
  EXPECT_GE(ThreadStackTlsReserve(), request);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  ASSERT_EQ(pthread_attr_setstacksize(&attr, request), 0);
  size_t granted = 0;
  pthread_attr_getstacksize(&attr, &granted);
  EXPECT_GE(granted, request + ThreadStackTlsReserve() - 4096);
  pthread_t t;
  const int rc = pthread_create(&t, &attr, TouchStack, &request);
  pthread_attr_destroy(&attr);
  ASSERT_EQ(rc, 0) << strerror(rc);
  pthread_join(t, nullptr);
}

// Catches the original failure: "null context when constructing CivetServer" next to LibTorch's
// libraries (OpenBLAS as the system BLAS, or CUDA's ~160 KiB of static TLS).
TEST(ThreadStackTest, TheMetricsServerStartsInALibTorchProcess) {
  at::Tensor t = torch::ones({2});  // LibTorch is loaded and used
  absl::StatusOr<std::unique_ptr<WorkerMetrics>> m = WorkerMetrics::Start("127.0.0.1:0");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_GT((*m)->port(), 0);
  EXPECT_EQ(t.sum().item<float>(), 2.0f);
}

}  // namespace
}  // namespace trainstep
