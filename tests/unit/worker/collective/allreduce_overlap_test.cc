// The all-reduce overlapped with the last backward (Collective::StartAllReduceSum, the
// replica's gradient hooks): the same buckets and bitwise the same sums as the all-reduce after
// backward, buckets launched in order whatever order gradients become final, gradients that
// never become final reduced after backward instead of hanging the window. Ranks are threads
// of this process joined in a real Gloo group over an in-process store.
#include <gtest/gtest.h>
#include <torch/script.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <functional>
#include <thread>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/spec.h"
#include "worker/collective/collective.h"
#include "worker/data/collate.h"
#include "worker/data/dataset.h"
#include "worker/train/replica.h"

namespace trainstep {
namespace {

// Runs fn(rank, collective) on `world` threads that joined one CPU group.
void OnRanks(int world, const std::function<void(int, Collective&)>& fn) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      CollectiveOptions o;
      o.timeout = absl::Seconds(60);
      absl::StatusOr<std::unique_ptr<Collective>> c =
          Collective::Connect(store, r, world, "test", o);
      ASSERT_TRUE(c.ok()) << c.status();
      fn(r, **c);
    });
  }
  for (std::thread& t : threads) t.join();
}

std::vector<at::Tensor> Clone(const std::vector<at::Tensor>& v) {
  std::vector<at::Tensor> out;
  for (const at::Tensor& t : v) out.push_back(t.clone());
  return out;
}

// Rank r's gradients: random values (not exactly summable, so a different bucketing or
// summation would show in the bits), float and double mixed, some larger than the cap.
std::vector<std::vector<at::Tensor>> RandomGrads(int world) {
  torch::manual_seed(11);
  std::vector<std::vector<at::Tensor>> out(world);
  const std::vector<std::pair<std::vector<int64_t>, at::ScalarType>> shapes = {
      {{7, 5}, at::kFloat}, {{3}, at::kFloat},    {{300}, at::kFloat},  {{4, 6}, at::kDouble},
      {{2}, at::kDouble},   {{50}, at::kFloat},   {{9, 9}, at::kFloat}, {{1}, at::kFloat},
      {{64}, at::kDouble},  {{20, 3}, at::kFloat}};
  for (int r = 0; r < world; ++r) {
    for (const auto& [shape, dtype] : shapes) {
      out[r].push_back(torch::randn(shape, torch::TensorOptions().dtype(dtype)) * 1e3);
    }
  }
  return out;
}

// Catches: an overlapped all-reduce with other buckets, another packing or a missing copy-back
// (the bits would differ from the post-backward path), calls or bytes counted differently,
// ranks that launch in the order tensors became final (here a different order on every rank:
// Gloo would pair different buckets and sum the wrong tensors, or fail on their sizes).
TEST(AllReduceOverlapTest, OverlappedSumEqualsTheSumAfterBackwardBitwise) {
  const int world = 3;  // Gloo's ring sums elements in an order that depends on their offset
  const int64_t cap = 256;
  const std::vector<std::vector<at::Tensor>> grads = RandomGrads(world);
  at::Tensor expected_first = at::zeros_like(grads[0][2]);
  for (int r = 0; r < world; ++r) expected_first += grads[r][2];
  OnRanks(world, [&](int rank, Collective& c) {
    std::vector<at::Tensor> after = Clone(grads[rank]), overlapped = Clone(grads[rank]);
    absl::StatusOr<AllReduceStats> a = c.AllReduceSum(after, cap);
    ASSERT_TRUE(a.ok()) << a.status();

    std::unique_ptr<PendingAllReduce> p = c.StartAllReduceSum(overlapped, cap);
    std::vector<size_t> order(overlapped.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    if (rank == 1) std::reverse(order.begin(), order.end());
    if (rank == 2) std::rotate(order.begin(), order.begin() + 4, order.end());
    for (size_t i : order) p->MarkReady(i, overlapped[i]);
    EXPECT_EQ(p->launched(), a->calls);  // all final: all launched before Finish
    absl::StatusOr<AllReduceStats> o = p->Finish(overlapped);
    ASSERT_TRUE(o.ok()) << o.status();

    EXPECT_GT(a->calls, 5);  // several buckets: cap, dtype changes, tensors alone
    EXPECT_EQ(o->calls, a->calls);
    EXPECT_EQ(o->bytes, a->bytes);
    EXPECT_EQ(o->overlapped_calls, o->calls);
    EXPECT_EQ(a->overlapped_calls, 0);
    for (size_t i = 0; i < after.size(); ++i) {
      EXPECT_TRUE(at::equal(after[i], overlapped[i])) << "tensor " << i;
    }
    // And it is the sum (not the same wrong thing twice).
    EXPECT_TRUE(at::allclose(after[2], expected_first, 1e-5, 1e-3));
  });
}

// Four float tensors of 64 elements, a cap of 256 bytes: one bucket each.
std::vector<at::Tensor> FourBuckets(int rank) {
  std::vector<at::Tensor> g;
  for (int i = 0; i < 4; ++i) g.push_back(at::full({64}, 10.0 * (i + 1) + rank));
  return g;
}

void ExpectFourBucketsSummed(const std::vector<at::Tensor>& g) {
  for (int i = 0; i < 4; ++i) {  // ranks 0 and 1: 2 · 10(i+1) + 0 + 1
    EXPECT_TRUE(at::equal(g[i], at::full({64}, 20.0 * (i + 1) + 1))) << "tensor " << i;
  }
}

// Catches: a bucket launched as soon as its own tensors are final, before the buckets ahead
// of it (ranks whose gradients finish in different orders would then launch different
// collectives at the same position), or a bucket launched before all its tensors are final.
TEST(AllReduceOverlapTest, LaunchesBucketsInOrderWhateverOrderGradientsBecomeFinal) {
  OnRanks(2, [](int rank, Collective& c) {
    std::vector<at::Tensor> g = FourBuckets(rank);
    std::unique_ptr<PendingAllReduce> p = c.StartAllReduceSum(g, 256);
    const std::vector<size_t> order =
        rank == 0 ? std::vector<size_t>{3, 2, 1, 0} : std::vector<size_t>{1, 3, 0, 2};
    const std::vector<int> launched_after =
        rank == 0 ? std::vector<int>{0, 0, 0, 4} : std::vector<int>{0, 0, 2, 4};
    EXPECT_FALSE(p->first_launch().has_value());
    for (size_t k = 0; k < order.size(); ++k) {
      p->MarkReady(order[k], g[order[k]]);
      EXPECT_EQ(p->launched(), launched_after[k]) << "after tensor " << order[k];
    }
    EXPECT_TRUE(p->first_launch().has_value());
    absl::StatusOr<AllReduceStats> s = p->Finish(g);
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(s->calls, 4);
    ExpectFourBucketsSummed(g);
  });
}

// Catches: a window that hangs (or leaves a gradient out of the SUM) when a parameter gets no
// gradient in the last backward, so its hook never fires: Finish launches that bucket and every
// one behind it, in order, also while the other rank launched all of them early.
TEST(AllReduceOverlapTest, GradientsNeverMadeFinalAreReducedAfterBackward) {
  OnRanks(2, [](int rank, Collective& c) {
    std::vector<at::Tensor> g = FourBuckets(rank);
    std::unique_ptr<PendingAllReduce> p = c.StartAllReduceSum(g, 256);
    for (size_t i = rank == 0 ? 1 : 0; i < g.size(); ++i) p->MarkReady(i, g[i]);
    EXPECT_EQ(p->launched(), rank == 0 ? 0 : 4);  // rank 0's bucket 0 holds everything up
    absl::StatusOr<AllReduceStats> s = p->Finish(g);
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(s->calls, 4);
    EXPECT_EQ(s->overlapped_calls, rank == 0 ? 0 : 4);
    ExpectFourBucketsSummed(g);
  });
}

// Catches: a gradient accumulated twice in one backward silently summed with its first value
// (its bucket already left): the window fails, naming the switch that avoids it.
TEST(AllReduceOverlapTest, AGradientMadeFinalTwiceFailsTheAllReduce) {
  OnRanks(1, [](int, Collective& c) {
    std::vector<at::Tensor> g = FourBuckets(0);
    std::unique_ptr<PendingAllReduce> p = c.StartAllReduceSum(g, 256);
    p->MarkReady(0, g[0]);
    p->MarkReady(0, g[0]);
    absl::StatusOr<AllReduceStats> s = p->Finish(g);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInternal);
    EXPECT_TRUE(absl::StrContains(s.status().message(), "--overlap-allreduce=false")) << s.status();
  });
}

data::Sample Tokens(int seed, int length) {
  data::Sample s;
  for (int t = 0; t < length; ++t) s.input_ids.push_back((seed * 31 + t * 7 + t * t) % 256);
  s.labels = s.input_ids;
  return s;
}

// A TorchScript model with float and double parameters and one the forward never uses
// (registered first: it is last in bucket order, so the buckets ahead of it can overlap).
std::string WriteMixedDtypeTorchScript() {
  torch::manual_seed(4);
  torch::jit::Module m("Mixed");
  auto param = [](at::Tensor t) { return t.set_requires_grad(true); };
  m.register_parameter("unused", param(torch::randn({3, 3})), /*is_buffer=*/false);
  m.register_parameter("emb", param(torch::randn({256, 8}) * 0.1), false);
  m.register_parameter("proj", param(torch::randn({8, 8}, torch::kDouble) * 0.3), false);
  m.register_parameter("out", param(torch::randn({8, 256}) * 0.1), false);
  m.define(R"(
def forward(self, input_ids):
    h = torch.embedding(self.emb, input_ids)
    h = torch.tanh(torch.matmul(h.double(), self.proj)).float()
    return torch.matmul(h, self.out)
)");
  const std::string path = absl::StrCat(::testing::TempDir(), "/mixed-", getpid(), ".pt");
  m.save(path);
  return path;
}

struct ModelCase {
  std::string name;
  std::string model_json;
  int64_t bucket_bytes;
  bool every_parameter_used;
};

// Each rank trains K = 3 micro-batches on two identical replicas: one all-reduces after
// backward (as with --overlap-allreduce=false), the other from its hooks during the last
// backward. Everything the window reports from there on must be the same bits.
// Catches: hooks that never fire (or fire on the first micro-step only: autograd drops an
// accumulator nobody holds and makes a new one, without the hook, for the next graph), a hook
// that reads the gradient before the last accumulation, positions mapped to the wrong
// tensors, mixed dtypes packed together, a parameter without gradient hanging the window, and
// an unscale or norm that differs afterwards.
TEST(AllReduceOverlapTest, ReplicaHooksGiveTheSameWindowAsTheAllReduceAfterBackward) {
  const std::string torchscript = WriteMixedDtypeTorchScript();
  const std::vector<ModelCase> cases = {
      {"tiny_gpt", R"({"tiny_gpt":{"n_layer":2,"n_head":2,"d_model":16,"seq_len":16}})", 4096,
       true},
      {"torchscript float+double+unused",
       absl::StrCat(R"({"torchscript":{"path":")", torchscript, R"("}})"), 1024, false},
  };
  std::vector<data::Sample> samples;
  for (int i = 0; i < 12; ++i) samples.push_back(Tokens(i, 4 + (i * 5) % 11));
  const data::Dataset d = data::Dataset::FromSamples(samples);
  for (const ModelCase& mc : cases) {
    SCOPED_TRACE(mc.name);
    absl::StatusOr<v1::JobSpec> spec = ParseAndResolveJobSpec(
        absl::StrCat(R"({"seed":9,"model":)", mc.model_json,
                     R"(,"data":{"text":{"paths":["/dev/null"],"seq_len":16}},)",
                     R"("optimizer":{"adamw":{"lr":0.01}}})"));
    ASSERT_TRUE(spec.ok()) << spec.status();
    // Built here, one after the other: a model seeds and draws from LibTorch's global RNG.
    std::vector<std::unique_ptr<Replica>> afters, overlappeds;
    for (int r = 0; r < 2; ++r) {
      absl::StatusOr<std::unique_ptr<Replica>> a = Replica::Create(*spec, at::kCPU);
      absl::StatusOr<std::unique_ptr<Replica>> o = Replica::Create(*spec, at::kCPU);
      ASSERT_TRUE(a.ok()) << a.status();
      ASSERT_TRUE(o.ok()) << o.status();
      ASSERT_TRUE((*o)->gradient_hooks()) << (*o)->gradient_hooks_missing();
      afters.push_back(*std::move(a));
      overlappeds.push_back(*std::move(o));
    }
    OnRanks(2, [&](int rank, Collective& c) {
      std::unique_ptr<Replica>* after = &afters[rank];
      std::unique_ptr<Replica>* overlapped = &overlappeds[rank];
      const double multiplier = 4.0 / 100;  // S / N with S = 4
      std::unique_ptr<PendingAllReduce> p =
          c.StartAllReduceSum((*overlapped)->BucketGradients(), mc.bucket_bytes);
      const GradientReadyFn on_ready = [&](size_t i, const at::Tensor& g) { p->MarkReady(i, g); };
      for (int k = 0; k < 3; ++k) {
        const data::MicroBatch mb = data::Collate(d, {6 * rank + 2 * k, 6 * rank + 2 * k + 1});
        ASSERT_TRUE((*after)->MicroStep(mb, multiplier).ok());
        ASSERT_TRUE(
            (*overlapped)->MicroStep(mb, multiplier, nullptr, k == 2 ? &on_ready : nullptr).ok());
      }
      const int early = p->launched();
      absl::StatusOr<AllReduceStats> a =
          c.AllReduceSum((*after)->BucketGradients(), mc.bucket_bytes);
      absl::StatusOr<AllReduceStats> o = p->Finish((*overlapped)->BucketGradients());
      ASSERT_TRUE(a.ok()) << a.status();
      ASSERT_TRUE(o.ok()) << o.status();
      EXPECT_GT(a->calls, 2);
      EXPECT_EQ(o->calls, a->calls);
      EXPECT_EQ(o->bytes, a->bytes);
      EXPECT_EQ(o->overlapped_calls, early);
      if (mc.every_parameter_used) {
        EXPECT_EQ(early, o->calls);  // every bucket left during backward
      } else {
        EXPECT_GT(early, 0);
        EXPECT_LT(early, o->calls);  // the unused parameter's bucket waited for the end
      }
      const std::vector<at::Tensor> ga = (*after)->Gradients(), go = (*overlapped)->Gradients();
      ASSERT_EQ(ga.size(), go.size());
      bool some_double = false;
      for (size_t i = 0; i < ga.size(); ++i) {
        EXPECT_TRUE(at::equal(ga[i], go[i])) << "gradient " << i;
        some_double |= go[i].scalar_type() == at::kDouble;
      }
      EXPECT_EQ(some_double, !mc.every_parameter_used);
      const UnscaleResult ua = (*after)->UnscaleAndNorm(4.0);
      const UnscaleResult uo = (*overlapped)->UnscaleAndNorm(4.0);
      EXPECT_FALSE(uo.found_inf);
      EXPECT_EQ(uo.found_inf, ua.found_inf);
      EXPECT_GT(uo.grad_norm, 0.0);
      EXPECT_EQ(uo.grad_norm, ua.grad_norm);  // exactly: the same bits in, the same norm out
    });
  }
}

}  // namespace
}  // namespace trainstep
