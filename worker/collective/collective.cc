#include "worker/collective/collective.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#ifdef TRAINSTEP_WITH_CUDA
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/collective/coordinator_store.h"
#include "worker/device.h"
#include "worker/torch_status.h"

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

Collective::~Collective() = default;

absl::StatusOr<std::unique_ptr<Collective>> Collective::Connect(WorkerClient* client,
                                                                const std::string& job_id,
                                                                const v1::Assignment& a,
                                                                const CollectiveOptions& options) {
  auto base = c10::make_intrusive<CoordinatorStore>(client, job_id, Millis(options.timeout));
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
        auto opts = c10d::ProcessGroupGloo::Options::create(Millis(options.timeout));
        opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(options.host));
        c->group_ = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world_size, opts);
      });
  if (!s.ok()) return s;
  return c;
}

absl::StatusOr<AllReduceStats> Collective::AllReduceSum(const std::vector<at::Tensor>& tensors,
                                                        int64_t bucket_bytes) {
  AllReduceStats stats;
  size_t i = 0;
  while (i < tensors.size()) {
    // One bucket: consecutive tensors of one dtype while they fit.
    std::vector<at::Tensor> members = {tensors[i]};
    int64_t bytes = tensors[i].numel() * tensors[i].element_size();
    size_t j = i + 1;
    while (j < tensors.size() && tensors[j].scalar_type() == tensors[i].scalar_type() &&
           bytes + tensors[j].numel() * tensors[j].element_size() <= bucket_bytes) {
      bytes += tensors[j].numel() * tensors[j].element_size();
      members.push_back(tensors[j]);
      ++j;
    }
    std::vector<at::Tensor> bucket;
    try {
      std::vector<at::Tensor> flat_views;
      for (const at::Tensor& t : members) flat_views.push_back(t.reshape({-1}));
      bucket = {at::cat(flat_views)};
    } catch (const std::exception& e) {  // a local fault, not a lost peer: fail, do not rejoin
      return absl::InternalError(
          absl::StrCat("packing gradients for the all-reduce: ", ShortWhat(e)));
    }
    absl::Status s = Catching("gradient all-reduce", [&] { group_->allreduce(bucket)->wait(); });
    if (!s.ok()) return s;
    int64_t offset = 0;
    for (at::Tensor& t : members) {
      t.copy_(bucket[0].narrow(0, offset, t.numel()).view_as(t));
      offset += t.numel();
    }
    ++stats.calls;
    stats.bytes += bytes;
    i = j;
  }
  return stats;
}

absl::Status Collective::BroadcastBytes(std::string* bytes, int src) {
  const at::TensorOptions cpu_long = at::TensorOptions().dtype(at::kLong);
  std::vector<at::Tensor> size = {
      at::full({1}, static_cast<int64_t>(rank_ == src ? bytes->size() : 0), cpu_long).to(device_)};
  RETURN_IF_ERROR(Catching("state broadcast (size)", [&] {
    c10d::BroadcastOptions o;
    o.rootRank = src;
    group_->broadcast(size, o)->wait();
  }));
  const int64_t n = size[0].cpu().item<int64_t>();
  at::Tensor buf = at::empty({n}, at::TensorOptions().dtype(at::kByte));
  if (rank_ == src) std::memcpy(buf.data_ptr(), bytes->data(), bytes->size());
  std::vector<at::Tensor> payload = {buf.to(device_)};
  RETURN_IF_ERROR(Catching("state broadcast", [&] {
    c10d::BroadcastOptions o;
    o.rootRank = src;
    group_->broadcast(payload, o)->wait();
  }));
  if (rank_ != src) {
    at::Tensor host = payload[0].cpu();
    bytes->assign(static_cast<const char*>(host.data_ptr()), static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

}  // namespace trainstep
