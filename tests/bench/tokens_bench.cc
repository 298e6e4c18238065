// What checking and fingerprinting a token file (data.tokens) costs a worker at start, on a
// 100 MB uint16 file, against the alternatives for the fingerprint measured side by side:
// no hash (the vocabulary check alone), byte-wise FNV-1a 64 (what the other data sources
// use), XXH64 of the whole file (the choice), and XXH64 of 64 sampled 64 KiB blocks.
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <random>
#include <string>

#include "common/xxh64.h"
#include "core/spec.h"
#include "worker/data/dataset.h"
#include "worker/data/tokens.h"

namespace trainstep::data {
namespace {

constexpr size_t kBytes = 100 * 1000 * 1000;

const std::string& Bytes() {
  static const std::string* bytes = [] {
    auto* s = new std::string(kBytes, '\0');
    std::mt19937 g(1);
    for (size_t i = 0; i + 1 < kBytes; i += 2) {
      const uint32_t id = g() % 50257;  // GPT-2's vocabulary
      (*s)[i] = static_cast<char>(id & 0xff);
      (*s)[i + 1] = static_cast<char>(id >> 8);
    }
    return s;
  }();
  return *bytes;
}

const std::string& FilePath() {
  static const std::string* path = [] {
    auto* p = new std::string("/tmp/trainstep-tokens-bench-" + std::to_string(getpid()) + ".bin");
    std::ofstream(*p, std::ios::binary) << Bytes();
    std::atexit([] { std::remove(FilePath().c_str()); });
    return p;
  }();
  return *path;
}

TokenFileFormat Format() {
  TokenFileFormat f;
  f.width = 2;
  f.seq_len = 1024;
  f.vocab = 50304;
  return f;
}

void SetBytes(benchmark::State& state) {
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * kBytes);
}

// The worker's whole start-up cost for the file: open, map, check, hash (page cache warm).
void BM_TokenFileOpen(benchmark::State& state) {
  const std::string& path = FilePath();
  for (auto _ : state) {
    absl::StatusOr<std::unique_ptr<TokenFile>> f = TokenFile::Open(path, Format());
    if (!f.ok()) state.SkipWithError(std::string(f.status().message()).c_str());
    benchmark::DoNotOptimize((*f)->Fingerprint());
  }
  SetBytes(state);
}
BENCHMARK(BM_TokenFileOpen)->Unit(benchmark::kMillisecond);

// The check and the hash on bytes already in memory (no page faults).
void BM_ScanTokenBytes(benchmark::State& state) {
  const std::string& b = Bytes();
  for (auto _ : state) benchmark::DoNotOptimize(ScanTokenBytes("mem", b, Format()));
  SetBytes(state);
}
BENCHMARK(BM_ScanTokenBytes)->Unit(benchmark::kMillisecond);

// The vocabulary check alone: the floor, since it must read every id anyway.
void BM_VocabularyCheckOnly(benchmark::State& state) {
  const std::string& b = Bytes();
  const unsigned char* p = reinterpret_cast<const unsigned char*>(b.data());
  for (auto _ : state) {
    uint32_t m = 0;
    for (size_t i = 0; i + 1 < kBytes; i += 2) {
      m = std::max(m, uint32_t{p[i]} | uint32_t{p[i + 1]} << 8);
    }
    benchmark::DoNotOptimize(m);
  }
  SetBytes(state);
}
BENCHMARK(BM_VocabularyCheckOnly)->Unit(benchmark::kMillisecond);

void BM_Xxh64WholeFile(benchmark::State& state) {
  const std::string& b = Bytes();
  for (auto _ : state) benchmark::DoNotOptimize(Xxh64Of(b));
  SetBytes(state);
}
BENCHMARK(BM_Xxh64WholeFile)->Unit(benchmark::kMillisecond);

void BM_Fnv1aWholeFile(benchmark::State& state) {
  const std::string& b = Bytes();
  for (auto _ : state) {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (unsigned char c : b) {
      h ^= c;
      h *= 0x100000001b3ULL;
    }
    benchmark::DoNotOptimize(h);
  }
  SetBytes(state);
}
BENCHMARK(BM_Fnv1aWholeFile)->Unit(benchmark::kMillisecond);

void BM_Xxh64SampledBlocks(benchmark::State& state) {
  const std::string& b = Bytes();
  constexpr size_t kBlock = 64 * 1024, kBlocks = 64;
  for (auto _ : state) {
    Xxh64 h;
    for (size_t k = 0; k < kBlocks; ++k) {
      h.Update(std::string_view(b).substr((kBytes - kBlock) / (kBlocks - 1) * k, kBlock));
    }
    benchmark::DoNotOptimize(h.Digest());
  }
}
BENCHMARK(BM_Xxh64SampledBlocks)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace trainstep::data

BENCHMARK_MAIN();
