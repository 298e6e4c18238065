// What the worker needs to know about the CPU and the BLAS it runs on, parsed from text
// (/proc/cpuinfo, /proc/self/maps) by pure functions; host_setup.cc reads the files.
#ifndef TRAINSTEP_WORKER_HOST_CPU_INFO_H_
#define TRAINSTEP_WORKER_HOST_CPU_INFO_H_

#include <set>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace trainstep {

struct CpuInfo {
  std::string model;            // "model name" of the first processor; "" if absent
  int logical_cpus = 0;         // "processor" entries
  std::set<std::string> flags;  // of the first processor
};

// Parses the text of /proc/cpuinfo (x86 "flags", or "Features" elsewhere).
CpuInfo ParseCpuInfo(absl::string_view proc_cpuinfo);

// The CPU flags that make bf16 arithmetic native (avx512_bf16: AVX-512 BF16 dot products,
// amx_bf16: AMX tiles); empty when bf16 would be emulated in fp32 arithmetic.
std::vector<std::string> NativeBf16Flags(const CpuInfo& cpu);

// The BLAS the process has mapped, as /proc/self/maps names it (resolved paths, so the
// libblas.so.3 alternative shows as the library it points at).
struct BlasLibrary {
  enum class Kind { kNone, kOpenBlas, kReference, kMkl, kBlis, kOther };
  Kind kind = Kind::kNone;
  std::string path;  // the implementation (libopenblas*.so for OpenBLAS), "" for kNone
};
BlasLibrary FindBlas(absl::string_view proc_maps);
const char* BlasKindName(BlasLibrary::Kind kind);

}  // namespace trainstep

#endif  // TRAINSTEP_WORKER_HOST_CPU_INFO_H_
