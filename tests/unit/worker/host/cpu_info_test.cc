// /proc/cpuinfo and /proc/self/maps parsing, on fixture text from real machines.
#include "worker/host/cpu_info.h"

#include <gtest/gtest.h>

#include <string>

namespace trainstep {
namespace {

// Two processors of an AVX2-only AMD EPYC (Zen 2): no avx512 at all.
constexpr char kZen2[] =
    "processor\t: 0\n"
    "vendor_id\t: AuthenticAMD\n"
    "model name\t: AMD EPYC 7B12\n"
    "flags\t\t: fpu vme sse sse2 avx f16c fma avx2 bmi2 sha_ni clzero\n"
    "\n"
    "processor\t: 1\n"
    "vendor_id\t: AuthenticAMD\n"
    "model name\t: AMD EPYC 7B12\n"
    "flags\t\t: fpu vme sse sse2 avx f16c fma avx2 bmi2 sha_ni clzero\n"
    "\n";

// Skylake-SP: AVX-512 but no bf16 instructions (oneDNN emulates them).
constexpr char kSkylake[] =
    "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Gold 6148 CPU @ 2.40GHz\n"
    "flags\t\t: fpu avx2 avx512f avx512dq avx512cd avx512bw avx512vl\n";

// Zen 4 (the machine BENCHMARKS.md measures on): AVX-512 with BF16.
constexpr char kZen4[] =
    "processor\t: 0\nmodel name\t: AMD EPYC\n"
    "flags\t\t: fpu avx2 avx512f avx512dq avx512bw avx512vl avx512_bf16 avx512_vnni\n";

// Sapphire Rapids: AVX-512 BF16 and AMX.
constexpr char kSapphireRapids[] =
    "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz\n"
    "flags\t\t: fpu avx512f avx512_bf16 amx_bf16 amx_tile amx_int8 avx512_fp16\n";

// Catches: the flags of every processor merged or counted as processors, the model lost.
TEST(CpuInfoTest, ParsesModelProcessorsAndFlags) {
  const CpuInfo cpu = ParseCpuInfo(kZen2);
  EXPECT_EQ(cpu.model, "AMD EPYC 7B12");
  EXPECT_EQ(cpu.logical_cpus, 2);
  EXPECT_EQ(cpu.flags.count("avx2"), 1u);
  EXPECT_EQ(cpu.flags.count("avx512f"), 0u);
  EXPECT_EQ(cpu.flags.size(), 11u);
}

// Catches: AVX-512 (or AVX-512 VNNI) taken for native bf16, avx512_bf16 or amx_bf16 missed.
TEST(CpuInfoTest, NativeBf16NeedsAvx512Bf16OrAmxBf16) {
  EXPECT_TRUE(NativeBf16Flags(ParseCpuInfo(kZen2)).empty());
  EXPECT_TRUE(NativeBf16Flags(ParseCpuInfo(kSkylake)).empty());
  EXPECT_EQ(NativeBf16Flags(ParseCpuInfo(kZen4)), std::vector<std::string>{"avx512_bf16"});
  EXPECT_EQ(NativeBf16Flags(ParseCpuInfo(kSapphireRapids)),
            (std::vector<std::string>{"avx512_bf16", "amx_bf16"}));
}

// Catches: a crash or a made-up model on text without the fields (containers, other arches).
TEST(CpuInfoTest, EmptyOrForeignTextGivesAnEmptyDescription) {
  EXPECT_EQ(ParseCpuInfo("").logical_cpus, 0);
  const CpuInfo arm = ParseCpuInfo("processor\t: 0\nFeatures\t: fp asimd bf16 i8mm\n");
  EXPECT_EQ(arm.model, "");
  EXPECT_EQ(arm.flags.count("bf16"), 1u);
  EXPECT_TRUE(NativeBf16Flags(arm).empty());
}

std::string MapsLine(const std::string& path) {
  return "7f15e9792000-7f15e97a0000 r-xp 00002000 08:01 1234567                    " + path + "\n";
}

const char kCommon[] =
    "55d0c0a00000-55d0c0a21000 r--p 00000000 08:01 42 /work/build/bin/trainstep-worker\n"
    "7ffd1c3d0000-7ffd1c3f1000 rw-p 00000000 00:00 0                          [stack]\n"
    "7f15e9000000-7f15e9100000 rw-p 00000000 00:00 0 \n";

// Catches: the libblas.so.3 alternative reported instead of what it points at, OpenBLAS's
// wrapper libblas.so.3 taken for the reference BLAS, anonymous mappings taken for files.
TEST(FindBlasTest, NamesTheImplementationTheProcessMapped) {
  const std::string reference = kCommon +
                                MapsLine("/usr/lib/x86_64-linux-gnu/blas/libblas.so.3.11.0") +
                                MapsLine("/usr/lib/x86_64-linux-gnu/lapack/liblapack.so.3.11.0");
  BlasLibrary b = FindBlas(reference);
  EXPECT_EQ(b.kind, BlasLibrary::Kind::kReference);
  EXPECT_EQ(b.path, "/usr/lib/x86_64-linux-gnu/blas/libblas.so.3.11.0");

  const std::string openblas =
      kCommon + MapsLine("/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3") +
      MapsLine("/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3") +
      MapsLine("/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblasp-r0.3.21.so");
  b = FindBlas(openblas);
  EXPECT_EQ(b.kind, BlasLibrary::Kind::kOpenBlas);
  EXPECT_EQ(b.path, "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblasp-r0.3.21.so");

  b = FindBlas(kCommon + MapsLine("/opt/intel/oneapi/mkl/lib/libmkl_rt.so.2"));
  EXPECT_EQ(b.kind, BlasLibrary::Kind::kMkl);
  b = FindBlas(kCommon + MapsLine("/usr/lib/x86_64-linux-gnu/atlas/libblas.so.3.10.3"));
  EXPECT_EQ(b.kind, BlasLibrary::Kind::kOther);
  EXPECT_EQ(b.path, "/usr/lib/x86_64-linux-gnu/atlas/libblas.so.3.10.3");
}

// Catches: a path with spaces cut at the first one; a process without a BLAS misreported.
TEST(FindBlasTest, PathsWithSpacesAndNoBlas) {
  BlasLibrary b = FindBlas(kCommon + MapsLine("/home/a user/lib/libopenblas.so.0"));
  EXPECT_EQ(b.kind, BlasLibrary::Kind::kOpenBlas);
  EXPECT_EQ(b.path, "/home/a user/lib/libopenblas.so.0");
  b = FindBlas(kCommon);
  EXPECT_EQ(b.kind, BlasLibrary::Kind::kNone);
  EXPECT_EQ(b.path, "");
}

}  // namespace
}  // namespace trainstep
