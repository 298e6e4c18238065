#include "worker/host/thread_stack.h"

#include <dlfcn.h>
#include <link.h>
#include <pthread.h>

#include <cerrno>
#include <cstdint>

namespace trainstep {
namespace {

// glibc's thread descriptor (struct pthread, ~2.3 KiB), its static TLS surplus for
// dlopen'ed modules (~1.7 KiB + 512 B), MINIMAL_REST_STACK and alignment: 16 KiB covers them
// with room to spare.
constexpr size_t kGlibcReserve = 16 << 10;

int AddTlsSegments(struct dl_phdr_info* info, size_t /*size*/, void* total) {
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_TLS) continue;
    const size_t align = ph.p_align > 0 ? ph.p_align : 1;
    *static_cast<size_t*>(total) += (ph.p_memsz + align - 1) / align * align;
  }
  return 0;
}

using SetStackSizeFn = int (*)(pthread_attr_t*, size_t);

SetStackSizeFn LibcSetStackSize() {
  static const SetStackSizeFn fn =
      reinterpret_cast<SetStackSizeFn>(dlsym(RTLD_NEXT, "pthread_attr_setstacksize"));
  return fn;
}

}  // namespace

size_t ThreadStackTlsReserve() {
  size_t total = 0;
  dl_iterate_phdr(AddTlsSegments, &total);
  return total + kGlibcReserve;
}

}  // namespace trainstep

// Interposes libc's pthread_attr_setstacksize for the whole process (this definition is in
// the executable, which the dynamic linker searches first): see thread_stack.h for why.
// Computed on each call, so libraries loaded later count too; threads are created rarely.
extern "C" int pthread_attr_setstacksize(pthread_attr_t* attr, size_t stacksize) {
  const trainstep::SetStackSizeFn libc = trainstep::LibcSetStackSize();
  if (libc == nullptr) return ENOSYS;  // no libc definition to forward to
  const size_t reserve = trainstep::ThreadStackTlsReserve();
  if (stacksize > SIZE_MAX - reserve) return libc(attr, stacksize);
  return libc(attr, stacksize + reserve);
}
