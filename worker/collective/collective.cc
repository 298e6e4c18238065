#include "worker/collective/collective.h"

#include <algorithm>
#include <exception>
#include <thread>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#ifdef TRAINSTEP_WITH_CUDA
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"
#include "worker/collective/coordinator_store.h"
#include "worker/train/device.h"
#include "worker/train/torch_status.h"

namespace trainstep {
namespace {

std::chrono::milliseconds Millis(absl::Duration d) {
  return std::chrono::milliseconds(absl::ToInt64Milliseconds(d));
}

// A collective that throws lost a peer (or the generation): the worker rejoins.
template <typename Fn>
absl::Status Catching(const std::string& what, Fn&& fn) {
  return CatchTorch(absl::StatusCode::kUnavailable, what + " failed", std::forward<Fn>(fn));
}

}  // namespace

Collective::~Collective() {
  // Destroying a group joins its threads, which a collective still blocked on a stopped peer
  // holds until its timeout: leave it (its memory) to them instead of blocking this worker.
  if (abandoned_) (void)group_.release();
}

template <typename Start>
absl::Status Collective::Await(const std::string& what, Start&& start) {
  return CatchTorch(absl::StatusCode::kUnavailable, what + " failed",
                    [&] { WaitOrThrow(start()); });
}

void Collective::WaitOrThrow(const c10::intrusive_ptr<c10d::Work>& work) {
  const bool polled = options_.keep_waiting && !device_.is_cuda();
  if (!polled) {
    work->wait();
    return;
  }
  while (true) {
    try {
      work->wait(Millis(options_.poll));  // throws "timed out" while the peers are not there
      return;
    } catch (const std::exception&) {
      // Done meanwhile (the poll's timeout raced the completion): an untimed wait returns at
      // once, or throws the collective's own error (a peer is gone).
      if (work->isCompleted()) {
        work->wait();
        return;
      }
      if (!options_.keep_waiting()) {
        abandoned_ = true;
        throw std::runtime_error(
            "the generation ended while this rank waited for the others (a peer was lost)");
      }
    }
  }
}

absl::StatusOr<std::unique_ptr<Collective>> Collective::Connect(std::shared_ptr<WorkerRpc> client,
                                                                const std::string& job_id,
                                                                const v1::Assignment& a,
                                                                const CollectiveOptions& options) {
  auto base = c10::make_intrusive<CoordinatorStore>(
      std::move(client), StoreScope{job_id, a.generation()}, Millis(options.timeout));
  auto store = c10::make_intrusive<c10d::PrefixStore>(a.store_prefix(), base);
  return Connect(store, a.rank(), a.world_size(), absl::StrCat("generation ", a.generation()),
                 options);
}

absl::StatusOr<std::unique_ptr<Collective>> Collective::Connect(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int world_size, const std::string& what,
    const CollectiveOptions& options) {
  std::unique_ptr<Collective> c(new Collective());
  c->rank_ = rank;
  c->world_size_ = world_size;
  c->device_ = options.device;
  c->options_ = options;
  absl::Status s =
      Catching(absl::StrCat("joining ", what, " as rank ", rank, " of ", world_size), [&] {
#ifdef TRAINSTEP_WITH_CUDA
        if (options.device.is_cuda()) {
          // NCCL runs each collective on its own stream, ordered after the work queued on
          // this rank's current stream of options.device; wait() orders that stream after it.
          UseDeviceInThisThread(options.device);
          auto opts = c10d::ProcessGroupNCCL::Options::create();
          opts->timeout = Millis(options.timeout);
          c->group_ = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, world_size, opts);
          return;
        }
#endif
        c->group_ = JoinGloo(store, rank, world_size, options);
      });
  if (!s.ok()) return s;
  return c;
}

c10::intrusive_ptr<C10dGroup> Collective::JoinGloo(const c10::intrusive_ptr<c10d::Store>& store,
                                                   int rank, int world_size,
                                                   const CollectiveOptions& options) {
  auto make = [store, rank, world_size, options] {
    auto opts = c10d::ProcessGroupGloo::Options::create(Millis(options.timeout));
    opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(options.host));
    return c10::intrusive_ptr<C10dGroup>(
        c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world_size, opts));
  };
  if (!options.keep_waiting) return make();
  // Gloo's full-mesh connect retries a peer that died after publishing its address until the
  // timeout, without asking anyone: it runs on its own thread, and is left to finish alone
  // once the generation is over (the rank then rejoins at once instead of 120 s later).
  struct Joining {
    absl::Mutex mu;
    bool done ABSL_GUARDED_BY(mu) = false;
    c10::intrusive_ptr<C10dGroup> group ABSL_GUARDED_BY(mu);
    std::exception_ptr error ABSL_GUARDED_BY(mu);
  };
  auto joining = std::make_shared<Joining>();
  std::thread([joining, make] {
    c10::intrusive_ptr<C10dGroup> group;
    std::exception_ptr error;
    try {
      group = make();
    } catch (...) {
      error = std::current_exception();
    }
    absl::MutexLock lock(&joining->mu);
    joining->group = std::move(group);
    joining->error = error;
    joining->done = true;
  }).detach();
  while (true) {
    {
      absl::MutexLock lock(&joining->mu);
      if (joining->mu.AwaitWithTimeout(
              absl::Condition(&joining->done),
              absl::Milliseconds(absl::ToInt64Milliseconds(options.poll)))) {
        if (joining->error) std::rethrow_exception(joining->error);
        return joining->group;
      }
    }
    if (!options.keep_waiting()) {
      throw std::runtime_error(
          "the generation ended while this rank connected to its peers (a peer was lost)");
    }
  }
}

std::vector<BucketRange> PlanBuckets(const std::vector<at::Tensor>& tensors, int64_t bucket_bytes,
                                     int64_t first_bucket_bytes) {
  std::vector<BucketRange> plan;
  size_t i = 0;
  while (i < tensors.size()) {
    const int64_t cap = plan.empty() ? std::min(first_bucket_bytes, bucket_bytes) : bucket_bytes;
    BucketRange b;
    b.begin = i;
    b.bytes = tensors[i].numel() * tensors[i].element_size();
    size_t j = i + 1;
    while (j < tensors.size() && tensors[j].scalar_type() == tensors[i].scalar_type() &&
           b.bytes + tensors[j].numel() * tensors[j].element_size() <= cap) {
      b.bytes += tensors[j].numel() * tensors[j].element_size();
      ++j;
    }
    b.end = j;
    plan.push_back(b);
    i = j;
  }
  return plan;
}

namespace {

// One flat tensor of the bucket's members (each flattened, in order): what is all-reduced.
// Both ways of running the all-reduce pack through here, so their sums are the same bits.
// Throws (LibTorch).
template <typename TensorOf>
at::Tensor PackBucket(const BucketRange& b, TensorOf&& tensor_of) {
  std::vector<at::Tensor> flat_views;
  flat_views.reserve(b.end - b.begin);
  for (size_t i = b.begin; i < b.end; ++i) flat_views.push_back(tensor_of(i).reshape({-1}));
  return at::cat(flat_views);
}

// The bucket's sum back into its members.
void UnpackBucket(const BucketRange& b, const at::Tensor& flat,
                  const std::vector<at::Tensor>& tensors) {
  int64_t offset = 0;
  for (size_t i = b.begin; i < b.end; ++i) {
    at::Tensor t = tensors[i];
    t.copy_(flat.narrow(0, offset, t.numel()).view_as(t));
    offset += t.numel();
  }
}

absl::Status PackingError(const std::exception& e) {
  // A local fault, not a lost peer: fail, do not rejoin.
  return absl::InternalError(absl::StrCat("packing gradients for the all-reduce: ", ShortWhat(e)));
}

constexpr char kAllReduceWhat[] = "gradient all-reduce";

}  // namespace

absl::StatusOr<AllReduceStats> Collective::AllReduceSum(const std::vector<at::Tensor>& tensors,
                                                        int64_t bucket_bytes) {
  AllReduceStats stats;
  for (const BucketRange& b : PlanBuckets(tensors, bucket_bytes)) {
    ++stats.calls;  // the same buckets at any world size: records compare across sizes
    stats.bytes += b.bytes;
    // One rank's sum is its own gradients: packing them and copying them back would cost a
    // full copy of the gradients in memory and two passes over them, for nothing.
    if (world_size_ == 1) continue;
    std::vector<at::Tensor> bucket;
    try {
      bucket = {PackBucket(b, [&](size_t i) -> const at::Tensor& { return tensors[i]; })};
    } catch (const std::exception& e) {
      return PackingError(e);
    }
    RETURN_IF_ERROR(Await(kAllReduceWhat, [&] { return group_->allreduce(bucket); }));
    UnpackBucket(b, bucket[0], tensors);
  }
  return stats;
}

struct PendingAllReduce::State {
  std::vector<BucketRange> plan;
  std::vector<size_t> bucket_of;  // by tensor
  // By tensor: its planned shape and dtype, then its final value once MarkReady gave it.
  std::vector<at::Tensor> planned;
  std::vector<at::Tensor> ready;
  std::vector<size_t> missing;                // by bucket: members not final yet
  size_t next = 0;                            // buckets [0, next) are launched
  std::vector<std::vector<at::Tensor>> flat;  // by launched bucket: the tensor summed in place
  std::vector<c10::intrusive_ptr<c10d::Work>> work;  // by launched bucket
  absl::Status error;
  bool finishing = false;
  std::optional<absl::Time> first_launch;
};

std::unique_ptr<PendingAllReduce> Collective::StartAllReduceSum(
    const std::vector<at::Tensor>& tensors, int64_t bucket_bytes) {
  auto state = std::make_unique<PendingAllReduce::State>();
  state->plan = PlanBuckets(tensors, bucket_bytes);
  state->bucket_of.resize(tensors.size());
  state->planned = tensors;
  state->ready.resize(tensors.size());
  for (size_t b = 0; b < state->plan.size(); ++b) {
    state->missing.push_back(state->plan[b].end - state->plan[b].begin);
    for (size_t i = state->plan[b].begin; i < state->plan[b].end; ++i) state->bucket_of[i] = b;
  }
  return std::unique_ptr<PendingAllReduce>(new PendingAllReduce(this, std::move(state)));
}

PendingAllReduce::PendingAllReduce(Collective* collective, std::unique_ptr<State> state)
    : collective_(collective), state_(std::move(state)) {}

PendingAllReduce::~PendingAllReduce() {
  absl::MutexLock lock(&mu_);
  AbandonIfRunning();
}

void PendingAllReduce::AbandonIfRunning() {
  for (const c10::intrusive_ptr<c10d::Work>& w : state_->work) {
    if (w && !w->isCompleted()) collective_->abandoned_ = true;
  }
}

void PendingAllReduce::MarkReady(size_t index, const at::Tensor& value) {
  absl::MutexLock lock(&mu_);
  State& s = *state_;
  if (s.finishing || !s.error.ok()) return;
  if (index >= s.ready.size()) {
    s.error = absl::InternalError(absl::StrCat("gradient ", index, " of ", s.ready.size(),
                                               " made final: there is no such gradient"));
    return;
  }
  if (s.ready[index].defined()) {
    // Its bucket may already be summed with the earlier value: the result would be wrong.
    s.error = absl::InternalError(absl::StrCat(
        "gradient ", index,
        " was accumulated twice in one backward (a parameter reached "
        "through a reentrant backward?): run the worker with --overlap-allreduce=false"));
    return;
  }
  const at::Tensor& planned = s.planned[index];
  if (!value.defined() || value.scalar_type() != planned.scalar_type() ||
      value.numel() != planned.numel()) {
    s.error = absl::InternalError(absl::StrCat(
        "gradient ", index, " changed shape or dtype during backward (",
        value.defined() ? c10::str(value.sizes(), " ", value.scalar_type()) : "undefined",
        " instead of ", c10::str(planned.sizes(), " ", planned.scalar_type()), ")"));
    return;
  }
  s.ready[index] = value;
  --s.missing[s.bucket_of[index]];
  LaunchReadyLocked();
}

void PendingAllReduce::LaunchReadyLocked() {
  State& s = *state_;
  while (s.error.ok() && s.next < s.plan.size() && s.missing[s.next] == 0) {
    LaunchLocked(s.next, nullptr);
  }
}

void PendingAllReduce::LaunchLocked(size_t b, const std::vector<at::Tensor>* tensors) {
  State& s = *state_;
  const BucketRange& range = s.plan[b];
  if (!s.first_launch.has_value()) s.first_launch = absl::Now();
  if (collective_->world_size() == 1) {  // as in Collective::AllReduceSum: nothing to do
    s.flat.emplace_back();
    s.work.emplace_back();
    ++s.next;
    return;
  }
  std::vector<at::Tensor> bucket;
  try {
    bucket = {PackBucket(range, [&](size_t i) -> const at::Tensor& {
      return tensors != nullptr ? (*tensors)[i] : s.ready[i];
    })};
  } catch (const std::exception& e) {
    s.error = PackingError(e);
    return;
  }
  c10::intrusive_ptr<c10d::Work> work;
  s.error = Catching(kAllReduceWhat, [&] { work = collective_->group_->allreduce(bucket); });
  if (!s.error.ok()) return;
  s.flat.push_back(std::move(bucket));
  s.work.push_back(std::move(work));
  ++s.next;
}

absl::StatusOr<AllReduceStats> PendingAllReduce::Finish(const std::vector<at::Tensor>& tensors) {
  absl::MutexLock lock(&mu_);
  State& s = *state_;
  s.finishing = true;
  AllReduceStats stats;
  stats.overlapped_calls = static_cast<int64_t>(s.next);
  if (s.error.ok() && tensors.size() != s.planned.size()) {
    s.error = absl::InternalError(absl::StrCat("all-reduce finished with ", tensors.size(),
                                               " gradients, started with ", s.planned.size()));
  }
  for (size_t i = 0; s.error.ok() && i < tensors.size(); ++i) {
    if (!tensors[i].defined() || tensors[i].numel() != s.planned[i].numel() ||
        tensors[i].scalar_type() != s.planned[i].scalar_type()) {
      s.error = absl::InternalError(absl::StrCat("gradient ", i, " changed shape or dtype"));
    }
  }
  // The rest, in order: parameters that got no gradient in this backward (their hooks never
  // fired), and every bucket behind one, are final now that backward returned.
  while (s.error.ok() && s.next < s.plan.size()) LaunchLocked(s.next, &tensors);
  if (!s.error.ok()) {
    AbandonIfRunning();
    return s.error;
  }
  // Hooks are over (backward returned): the waits hold the lock only against misuse.
  for (size_t b = 0; b < s.plan.size(); ++b) {
    ++stats.calls;
    stats.bytes += s.plan[b].bytes;
    if (!s.work[b]) continue;  // one rank: nothing was sent
    absl::Status waited =
        CatchTorch(absl::StatusCode::kUnavailable, absl::StrCat(kAllReduceWhat, " failed"),
                   [&] { collective_->WaitOrThrow(s.work[b]); });
    if (!waited.ok()) {
      AbandonIfRunning();
      return waited;
    }
    UnpackBucket(s.plan[b], s.flat[b][0], tensors);
  }
  return stats;
}

int PendingAllReduce::launched() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(state_->next);
}

std::optional<absl::Time> PendingAllReduce::first_launch() const {
  absl::MutexLock lock(&mu_);
  return state_->first_launch;
}

absl::Status Collective::BroadcastBytes(std::string* bytes, int src) {
  const at::TensorOptions cpu_long = at::TensorOptions().dtype(at::kLong);
  std::vector<at::Tensor> size = {
      at::full({1}, static_cast<int64_t>(rank_ == src ? bytes->size() : 0), cpu_long).to(device_)};
  c10d::BroadcastOptions from_src;
  from_src.rootRank = src;
  RETURN_IF_ERROR(
      Await("state broadcast (size)", [&] { return group_->broadcast(size, from_src); }));
  const int64_t n = size[0].cpu().item<int64_t>();
  at::Tensor buf = at::empty({n}, at::TensorOptions().dtype(at::kByte));
  if (rank_ == src) std::memcpy(buf.data_ptr(), bytes->data(), bytes->size());
  std::vector<at::Tensor> payload = {buf.to(device_)};
  RETURN_IF_ERROR(Await("state broadcast", [&] { return group_->broadcast(payload, from_src); }));
  if (rank_ != src) {
    at::Tensor host = payload[0].cpu();
    bytes->assign(static_cast<const char*>(host.data_ptr()), static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

}  // namespace trainstep
