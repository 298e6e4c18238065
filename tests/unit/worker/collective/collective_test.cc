// The collective (worker/collective/collective.h) over an in-process store: SUM (never AVG)
// in place, one call per ≤ bucket_bytes bucket of one dtype, and byte broadcasts. Gloo runs
// everywhere (two ranks on threads); the NCCL tests need GPUs and skip, saying so, without.
#include "worker/collective/collective.h"

#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <functional>
#include <memory>
#include <thread>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <vector>

#ifdef TRAINSTEP_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace trainstep {
namespace {

#ifdef TRAINSTEP_WITH_CUDA
constexpr bool kCudaBuild = true;
#else
constexpr bool kCudaBuild = false;
#endif

// Runs fn(rank, collective) on `world` threads that joined one group on `device_of(rank)`.
void OnRanks(int world, const std::function<at::Device(int)>& device_of,
             const std::function<void(int, Collective&)>& fn) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      CollectiveOptions o;
      o.device = device_of(r);
      o.timeout = absl::Seconds(60);
      absl::StatusOr<std::unique_ptr<Collective>> c =
          Collective::Connect(store, r, world, "test", o);
      ASSERT_TRUE(c.ok()) << c.status();
      fn(r, **c);
    });
  }
  for (std::thread& t : threads) t.join();
}

// Rank r's "gradients": (r + 1) × a fixed pattern, so the SUM over W ranks is W(W+1)/2 × it.
std::vector<at::Tensor> Grads(int rank, const at::Device& d) {
  auto o = torch::TensorOptions().device(d);
  std::vector<at::Tensor> g = {torch::arange(12, o.dtype(torch::kFloat)).view({3, 4}),
                               torch::arange(5, o.dtype(torch::kFloat)),
                               torch::arange(300, o.dtype(torch::kFloat)),
                               torch::arange(6, o.dtype(torch::kDouble)).view({2, 3})};
  for (at::Tensor& t : g) t.mul_(rank + 1);
  return g;
}

void ExpectSummed(const std::vector<at::Tensor>& got, int world) {
  std::vector<at::Tensor> pattern = Grads(0, at::kCPU);
  const double factor = world * (world + 1) / 2.0;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_TRUE(at::allclose(got[i].cpu(), pattern[i] * factor)) << "tensor " << i;
  }
}

// Catches: AVG instead of SUM (every rank's update would be 1/W too small), results not
// written back into the gradients, buckets that mix dtypes or exceed the cap (a tensor of
// 300 floats = 1200 bytes goes alone with a 1 KiB cap), calls per micro-batch.
TEST(CollectiveTest, GlooSumsInPlaceInBoundedBuckets) {
  OnRanks(
      2, [](int) { return at::Device(at::kCPU); },
      [](int rank, Collective& c) {
        std::vector<at::Tensor> g = Grads(rank, at::kCPU);
        absl::StatusOr<AllReduceStats> s = c.AllReduceSum(g, /*bucket_bytes=*/1024);
        ASSERT_TRUE(s.ok()) << s.status();
        // {3x4, 5} floats (68 B) | {300} floats alone | {2x3} doubles (another dtype).
        EXPECT_EQ(s->calls, 3);
        EXPECT_EQ(s->bytes, (12 + 5 + 300) * 4 + 6 * 8);
        ExpectSummed(g, 2);
        std::vector<at::Tensor> again = Grads(rank, at::kCPU);
        s = c.AllReduceSum(again);  // the default cap: one bucket per dtype
        ASSERT_TRUE(s.ok());
        EXPECT_EQ(s->calls, 2);
        ExpectSummed(again, 2);
      });
}

// Catches: a one-rank "sum" that packs every gradient into buckets and copies it back, a full
// extra copy of the gradients in memory and two passes over them each window, for the identity.
// The last gradient is a broadcast view (stride 0): packing copies it, writing back into it
// throws, so a write-back fails here. The calls and bytes are those of any world size.
TEST(CollectiveTest, OneRankSumLeavesTheGradientsAsTheyAre) {
  OnRanks(
      1, [](int) { return at::Device(at::kCPU); },
      [](int rank, Collective& c) {
        std::vector<at::Tensor> g = Grads(rank, at::kCPU);
        g.push_back(torch::ones({1}).expand({8}));
        absl::StatusOr<AllReduceStats> s = c.AllReduceSum(g, /*bucket_bytes=*/1024);
        ASSERT_TRUE(s.ok()) << s.status();
        // As GlooSumsInPlaceInBoundedBuckets, plus the float view after the doubles.
        EXPECT_EQ(s->calls, 4);
        EXPECT_EQ(s->bytes, (12 + 5 + 300) * 4 + 6 * 8 + 8 * 4);
        g.pop_back();
        ExpectSummed(g, 1);

        // The same when overlapped with backward: each bucket "launched" as it becomes final.
        std::vector<at::Tensor> o = Grads(rank, at::kCPU);
        o.push_back(torch::ones({1}).expand({8}));
        std::unique_ptr<PendingAllReduce> p = c.StartAllReduceSum(o, /*bucket_bytes=*/1024);
        for (size_t i = 0; i < o.size(); ++i) p->MarkReady(i, o[i]);
        EXPECT_EQ(p->launched(), 4);
        EXPECT_TRUE(p->first_launch().has_value());
        absl::StatusOr<AllReduceStats> os = p->Finish(o);
        ASSERT_TRUE(os.ok()) << os.status();
        EXPECT_EQ(os->calls, s->calls);
        EXPECT_EQ(os->bytes, s->bytes);
        EXPECT_EQ(os->overlapped_calls, 4);
        o.pop_back();
        ExpectSummed(o, 1);
      });
}

// Catches: a first bucket as big as the rest (a model under 25 MiB would make one bucket that
// leaves only when backward ends, so nothing overlaps), a first cap that outgrows a
// smaller `bucket_bytes`, a tensor bigger than the cap split or merged.
TEST(PlanBucketsTest, FirstBucketIsCappedAtOneMebibyteAsDdpDoes) {
  auto floats = [](int64_t kib) { return at::zeros({kib * 256}, at::kFloat); };
  // 256 KiB + 512 KiB fit the first 1 MiB; the next 512 KiB would not; the rest fits 25 MiB.
  const std::vector<at::Tensor> grads = {floats(256), floats(512), floats(512), floats(2048)};
  std::vector<BucketRange> plan = PlanBuckets(grads, kDefaultBucketBytes);
  ASSERT_EQ(plan.size(), 2u);
  EXPECT_EQ(plan[0].begin, 0u);
  EXPECT_EQ(plan[0].end, 2u);
  EXPECT_EQ(plan[0].bytes, 768 * 1024);
  EXPECT_EQ(plan[1].end, 4u);
  EXPECT_EQ(plan[1].bytes, 2560 * 1024);
  // A 2 MiB tensor first goes alone, then the rest share a bucket.
  plan = PlanBuckets({floats(2048), floats(256), floats(256)}, kDefaultBucketBytes);
  ASSERT_EQ(plan.size(), 2u);
  EXPECT_EQ(plan[0].end, 1u);
  // bucket_bytes below the first cap bounds the first bucket too.
  plan = PlanBuckets({floats(1), floats(1), floats(1)}, /*bucket_bytes=*/2048);
  ASSERT_EQ(plan.size(), 2u);
  EXPECT_EQ(plan[0].bytes, 2048);
  // A first cap equal to the rest gives the plain 25 MiB rule: one bucket.
  EXPECT_EQ(PlanBuckets(grads, kDefaultBucketBytes, kDefaultBucketBytes).size(), 1u);
}

// Catches: a broadcast that sends the wrong rank's bytes, truncates, or needs equal sizes.
TEST(CollectiveTest, GlooBroadcastsBytesFromAnyRank) {
  OnRanks(
      3, [](int) { return at::Device(at::kCPU); },
      [](int rank, Collective& c) {
        std::string bytes = rank == 1 ? std::string("state of rank 1\0with a zero", 27) : "x";
        ASSERT_TRUE(c.BroadcastBytes(&bytes, /*src=*/1).ok());
        EXPECT_EQ(bytes, std::string("state of rank 1\0with a zero", 27));
      });
}

// NCCL on every visible GPU (one rank each): the sum is right although the gradients were
// produced on a non-default current stream just before the call, which NCCL's stream must
// wait for, and is read back on that stream right after (it must wait for NCCL's).
TEST(CollectiveTest, CudaNcclSumsOnTheCurrentStream) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device visible here";
  if (!kCudaBuild) GTEST_SKIP() << "built without the CUDA path (TRAINSTEP_WITH_CUDA)";
#ifdef TRAINSTEP_WITH_CUDA
  const int world = static_cast<int>(torch::cuda::device_count());
  OnRanks(
      world, [](int r) { return at::Device(at::kCUDA, r); },
      [world](int rank, Collective& c) {
        const at::Device d(at::kCUDA, rank);
        c10::cuda::CUDAStream stream = c10::cuda::getStreamFromPool(false, rank);
        c10::cuda::CUDAStreamGuard guard(stream);
        // Slow work on the current stream that the gradients depend on.
        at::Tensor m = torch::randn({2048, 2048}, torch::TensorOptions().device(d));
        for (int i = 0; i < 4; ++i) m = at::matmul(m, m).clamp_(-1, 1);
        std::vector<at::Tensor> g = Grads(rank, d);
        for (at::Tensor& t : g) t.add_(m.abs().amax().clamp(0, 0).to(t.scalar_type()));
        absl::StatusOr<AllReduceStats> s = c.AllReduceSum(g, 1024);
        ASSERT_TRUE(s.ok()) << s.status();
        EXPECT_EQ(s->calls, 3);
        ExpectSummed(g, world);
        std::string bytes = rank == 0 ? "from rank 0" : "";
        ASSERT_TRUE(c.BroadcastBytes(&bytes, 0).ok());
        EXPECT_EQ(bytes, "from rank 0");
      });
#endif
}

}  // namespace
}  // namespace trainstep
