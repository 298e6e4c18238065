// Thread stacks that requested a fixed size still fit the process's static TLS.
//
// glibc carves a new thread's static TLS blocks (every PT_TLS segment of the libraries loaded
// at start) out of the stack size the caller asked for, and pthread_create fails with EINVAL
// when they do not fit (glibc bug 11787; musl adds the TLS on top instead). Debian's civetweb
// (under prometheus-cpp's Exposer) starts its threads with a fixed 100 KiB stack
// (pthread_attr_setstacksize(102400)), and LibTorch's libraries already hold ~47 KiB of
// static TLS; with OpenBLAS as libblas.so.3/liblapack.so.3, its 60 KiB PT_TLS segment brings
// the total to ~108 KiB, civetweb's master thread cannot start, and the Exposer throws "null
// context when constructing CivetServer". thread_stack.cc fixes it for every
// library in the process: it interposes pthread_attr_setstacksize, so a requested size is the
// usable stack and the static TLS comes on top. It is linked into every binary that links
// trainstep_worker_lib (an object file, not an archive member, so it is always there).
#ifndef TRAINSTEP_WORKER_HOST_THREAD_STACK_H_
#define TRAINSTEP_WORKER_HOST_THREAD_STACK_H_

#include <cstddef>

namespace trainstep {

// Bytes of static TLS a new thread's stack must hold: every loaded module's PT_TLS segment
// (rounded to its alignment) plus glibc's own reserve for the thread descriptor and surplus.
size_t ThreadStackTlsReserve();

}  // namespace trainstep

#endif  // TRAINSTEP_WORKER_HOST_THREAD_STACK_H_
