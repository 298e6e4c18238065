#include "worker/host/cpu_info.h"

#include <algorithm>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace trainstep {
namespace {

// "key\t: value" → (key, value), both trimmed; false for lines without a colon.
bool SplitField(absl::string_view line, absl::string_view* key, absl::string_view* value) {
  const size_t colon = line.find(':');
  if (colon == absl::string_view::npos) return false;
  *key = absl::StripAsciiWhitespace(line.substr(0, colon));
  *value = absl::StripAsciiWhitespace(line.substr(colon + 1));
  return true;
}

absl::string_view Basename(absl::string_view path) {
  const size_t slash = path.rfind('/');
  return slash == absl::string_view::npos ? path : path.substr(slash + 1);
}

absl::string_view Dirname(absl::string_view path) {
  const size_t slash = path.rfind('/');
  return slash == absl::string_view::npos ? absl::string_view() : path.substr(0, slash);
}

}  // namespace

CpuInfo ParseCpuInfo(absl::string_view proc_cpuinfo) {
  CpuInfo cpu;
  bool have_flags = false;
  for (absl::string_view line : absl::StrSplit(proc_cpuinfo, '\n')) {
    absl::string_view key, value;
    if (!SplitField(line, &key, &value)) continue;
    if (key == "processor") {
      ++cpu.logical_cpus;
    } else if (key == "model name" && cpu.model.empty()) {
      cpu.model = std::string(value);
    } else if ((key == "flags" || key == "Features") && !have_flags) {
      have_flags = true;
      for (absl::string_view f : absl::StrSplit(value, ' ', absl::SkipEmpty())) {
        cpu.flags.insert(std::string(f));
      }
    }
  }
  return cpu;
}

std::vector<std::string> NativeBf16Flags(const CpuInfo& cpu) {
  std::vector<std::string> out;
  for (const char* flag : {"avx512_bf16", "amx_bf16"}) {
    if (cpu.flags.count(flag) > 0) out.push_back(flag);
  }
  return out;
}

BlasLibrary FindBlas(absl::string_view proc_maps) {
  // A line: "start-end perms offset dev inode [path]"; the path may contain spaces.
  std::vector<std::string> paths;
  for (absl::string_view line : absl::StrSplit(proc_maps, '\n')) {
    std::vector<absl::string_view> f = absl::StrSplit(line, absl::MaxSplits(' ', 5));
    if (f.size() < 6) continue;
    absl::string_view path = absl::StripAsciiWhitespace(f[5]);
    if (!absl::StartsWith(path, "/")) continue;
    if (std::find(paths.begin(), paths.end(), path) == paths.end()) {
      paths.push_back(std::string(path));
    }
  }
  // An implementation library names itself; a libblas.so.3 says which only by its folder
  // (Debian: .../blas/ is the reference BLAS, .../openblas-*/ a wrapper of libopenblas).
  BlasLibrary libblas;
  for (const std::string& path : paths) {
    const absl::string_view base = Basename(path);
    if (absl::StrContains(base, "openblas")) return {BlasLibrary::Kind::kOpenBlas, path};
    if (absl::StartsWith(base, "libmkl_")) return {BlasLibrary::Kind::kMkl, path};
    if (absl::StartsWith(base, "libblis")) return {BlasLibrary::Kind::kBlis, path};
    if (absl::StartsWith(base, "libblas.so") && libblas.kind == BlasLibrary::Kind::kNone) {
      const absl::string_view dir = Basename(Dirname(path));
      libblas.path = path;
      libblas.kind = dir == "blas"                        ? BlasLibrary::Kind::kReference
                     : absl::StrContains(dir, "openblas") ? BlasLibrary::Kind::kOpenBlas
                                                          : BlasLibrary::Kind::kOther;
    }
  }
  return libblas;
}

const char* BlasKindName(BlasLibrary::Kind kind) {
  switch (kind) {
    case BlasLibrary::Kind::kNone:
      return "none";
    case BlasLibrary::Kind::kOpenBlas:
      return "OpenBLAS";
    case BlasLibrary::Kind::kReference:
      return "reference BLAS (netlib)";
    case BlasLibrary::Kind::kMkl:
      return "MKL";
    case BlasLibrary::Kind::kBlis:
      return "BLIS";
    case BlasLibrary::Kind::kOther:
      return "BLAS";
  }
  return "BLAS";
}

}  // namespace trainstep
