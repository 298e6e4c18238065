// glibc carves a thread's static TLS out of the stack size the thread is created with and
// fails pthread_create (EINVAL) when it does not fit. The libraries a LibTorch worker loads
// bring ~160 KB of static TLS with CUDA (cuBLASLt alone 100 KB) and ~60 KB more with OpenBLAS,
// while civetweb (prometheus-cpp's HTTP server) asks for 100 KB stacks: the worker's /metrics
// could not start ("null context when constructing CivetServer"). This definition, exported
// from the executable, comes before libc's for every library: requests below 1 MiB get 1 MiB.
#include <dlfcn.h>
#include <pthread.h>

#include <cstddef>

extern "C" int pthread_attr_setstacksize(pthread_attr_t* attr, size_t size) noexcept {
  using Fn = int (*)(pthread_attr_t*, size_t);
  static const Fn libc_version =
      reinterpret_cast<Fn>(dlsym(RTLD_NEXT, "pthread_attr_setstacksize"));
  constexpr size_t kMinimumStack = size_t{1} << 20;
  return libc_version(attr, size < kMinimumStack ? kMinimumStack : size);
}
