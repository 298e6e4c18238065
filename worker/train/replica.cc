#include "worker/train/replica.h"

#include <torch/autograd.h>
#include <torch/csrc/api/include/torch/utils.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <atomic>
#include <unordered_map>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/clock.h"
#include "common/status_macros.h"
#include "core/spec.h"
#include "worker/checkpoint/safetensors.h"
#include "worker/train/amp.h"
#include "worker/train/loss.h"
#include "worker/train/torch_status.h"

namespace trainstep {
namespace {

constexpr char kModelPrefix[] = "model/";
constexpr char kOptimPrefix[] = "optim/";

template <typename Fn>
absl::Status Catching(const std::string& what, Fn&& fn) {
  return CatchTorch(absl::StatusCode::kInternal, what, std::forward<Fn>(fn));
}

}  // namespace

struct GradientHookTarget {
  // Non-null only while a MicroStep that passed on_ready runs its backward.
  std::atomic<const GradientReadyFn*> on_ready{nullptr};
};

namespace {

// Runs after the AccumulateGrad node of one parameter (a Node post-hook: the same API in
// LibTorch 1.13 and 2.x), so the parameter's .grad holds this backward's sum then, whether
// the node added into it in place or set a new tensor.
class GradientReadyHook : public torch::autograd::FunctionPostHook {
 public:
  GradientReadyHook(std::shared_ptr<GradientHookTarget> target, size_t position, at::Tensor param)
      : target_(std::move(target)), position_(position), param_(std::move(param)) {}

  torch::autograd::variable_list operator()(
      const torch::autograd::variable_list& outputs,
      const torch::autograd::variable_list& /*inputs*/) override {
    if (const GradientReadyFn* on_ready = target_->on_ready.load(std::memory_order_acquire)) {
      (*on_ready)(position_, param_.grad());
    }
    return outputs;
  }

 private:
  std::shared_ptr<GradientHookTarget> target_;
  size_t position_;
  at::Tensor param_;  // its node holds it too
};

}  // namespace

absl::StatusOr<std::unique_ptr<Replica>> Replica::Create(const v1::JobSpec& resolved,
                                                         const at::Device& device,
                                                         const AllowedRoots& roots) {
  RETURN_IF_ERROR(CheckPrecision(resolved.precision(), device));
  std::unique_ptr<Replica> r(new Replica());
  r->spec_ = resolved;
  r->device_ = device;
  r->token_level_ = IsTokenLevel(resolved);
  ASSIGN_OR_RETURN(r->model_, BuildModel(resolved, roots));
  RETURN_IF_ERROR(Catching("moving the model to the device", [&] {
    r->model_->To(device);
    r->model_->SetTraining(true);
  }));
  ASSIGN_OR_RETURN(r->optim_, Optim::Build(resolved, r->model_->NamedParameters()));
  r->ZeroGrad();
  r->RegisterGradientHooks();
  return r;
}

void Replica::RegisterGradientHooks() {
  hook_target_ = std::make_shared<GradientHookTarget>();
  const std::vector<TrainableParam>& params = optim_->trainable();
  // A tensor listed twice (weights tied inside a TorchScript file) would be made final, and
  // all-reduced, at two positions: that needs the one-pass all-reduce after backward.
  std::unordered_map<const void*, const std::string*> seen;
  for (const TrainableParam& p : params) {
    auto [it, added] = seen.emplace(p.tensor.unsafeGetTensorImpl(), &p.name);
    if (!added) {
      hooks_missing_ = absl::StrCat("parameters ", *it->second, " and ", p.name,
                                    " are one tensor (tied weights)");
      return;
    }
  }
  std::vector<std::shared_ptr<torch::autograd::Node>> nodes;
  absl::Status s = Catching("hooking the gradient accumulators", [&] {
    for (size_t i = 0; i < params.size(); ++i) {
      std::shared_ptr<torch::autograd::Node> node =
          torch::autograd::impl::grad_accumulator(params[i].tensor);
      if (node == nullptr) {
        throw std::runtime_error(absl::StrCat(params[i].name, " has no gradient accumulator"));
      }
      // Its position in BucketGradients(): reverse parameter order.
      node->add_post_hook(std::make_unique<GradientReadyHook>(hook_target_, params.size() - 1 - i,
                                                              params[i].tensor));
      nodes.push_back(std::move(node));
    }
  });
  if (!s.ok()) {
    hooks_missing_ = std::string(s.message());  // hooks already added stay, never called
    return;
  }
  accumulators_ = std::move(nodes);
}

at::Tensor Replica::ForwardLossSum(const MicroBatchTensors& t) {
  at::Tensor output;
  {
    AutocastScope autocast(spec_.precision(), device_);
    output = model_->Forward(t.input);
  }
  if (token_level_ && (output.dim() != 3 || output.size(0) != t.input.size(0) ||
                       output.size(1) != t.input.size(1))) {
    throw std::runtime_error(absl::StrCat(
        "the model returned shape ", c10::str(output.sizes()), " for input ",
        c10::str(t.input.sizes()), "; forward(input_ids [B, T]) must return logits [B, T, V]"));
  }
  // The data's ids were checked against the model's vocabulary; a model whose vocab_size
  // attribute says otherwise than its logits would index past them in the loss.
  if (token_level_ && output.size(2) != model_->VocabSize()) {
    throw std::runtime_error(absl::StrCat("the model returned logits over ", output.size(2),
                                          " token ids, but ", ModelVocabSource(spec_), " is ",
                                          model_->VocabSize()));
  }
  return LossSum(output, t, token_level_);
}

absl::StatusOr<double> Replica::MicroStep(const data::MicroBatch& mb, double multiplier,
                                          MicroStepTimes* times, const GradientReadyFn* on_ready) {
  double loss_sum = 0.0;
  Stopwatch phase;
  double forward_seconds = 0.0;
  RETURN_IF_ERROR(Catching("forward/backward", [&] {
    at::Tensor loss = ForwardLossSum(ToTensors(mb, token_level_, device_));
    loss_sum = loss.item<double>();
    forward_seconds = phase.Seconds();
    phase.Restart();
    if (on_ready != nullptr && *on_ready && gradient_hooks()) {
      hook_target_->on_ready.store(on_ready, std::memory_order_release);
    }
    // backward() returns once every node ran (on whichever threads): no hook runs after this.
    auto disarm = absl::MakeCleanup(
        [this] { hook_target_->on_ready.store(nullptr, std::memory_order_release); });
    torch::autograd::backward({loss * multiplier});
  }));
  if (times != nullptr) {
    times->forward_seconds = forward_seconds;
    times->backward_seconds = phase.Seconds();
  }
  return loss_sum;
}

absl::StatusOr<double> Replica::EvalLossSum(const data::MicroBatch& mb) {
  double loss_sum = 0.0;
  RETURN_IF_ERROR(Catching("evaluation", [&] {
    torch::NoGradGuard no_grad;
    model_->SetTraining(false);  // dropout and the like off, as every evaluation loop does
    struct Restore {
      Model* m;
      ~Restore() { m->SetTraining(true); }
    } restore{model_.get()};
    loss_sum = ForwardLossSum(ToTensors(mb, token_level_, device_)).item<double>();
  }));
  return loss_sum;
}

std::vector<at::Tensor> Replica::Gradients() {
  std::vector<at::Tensor> grads;
  for (const TrainableParam& p : optim_->trainable()) grads.push_back(p.tensor.mutable_grad());
  return grads;
}

std::vector<at::Tensor> Replica::BucketGradients() {
  std::vector<at::Tensor> grads = Gradients();
  std::reverse(grads.begin(), grads.end());
  return grads;
}

uint64_t Replica::GradientChecksum() {
  uint64_t hash = 14695981039346656037ULL;  // FNV-1a 64 offset basis
  for (const at::Tensor& g : Gradients()) {
    const at::Tensor host = g.to(at::kCPU).contiguous();
    const auto* bytes = static_cast<const unsigned char*>(host.data_ptr());
    for (size_t i = 0, n = host.nbytes(); i < n; ++i) {
      hash ^= bytes[i];
      hash *= 1099511628211ULL;  // FNV-1a 64 prime
    }
  }
  return hash;
}

UnscaleResult Replica::UnscaleAndNorm(double loss_scale) {
  std::vector<at::Tensor> grads = Gradients();
  UnscaleResult r;
  // Queued before the in-place unscale, read after it: no extra device sync.
  std::optional<at::Tensor> scaled;
  if (spec_.loss_scaler().enabled()) scaled = GlobalNormTensor(grads);
  r.found_inf = trainstep::UnscaleAndCheck(grads, 1.0 / loss_scale);
  r.grad_norm = GlobalNorm(grads);
  if (scaled.has_value()) r.grad_norm_scaled = scaled->item<double>();
  return r;
}

void Replica::Commit(double clip_coef, double base_lr) {
  torch::NoGradGuard no_grad;
  if (clip_coef < 1.0) {
    for (at::Tensor& g : Gradients()) g.mul_(clip_coef);
  }
  optim_->SetLearningRate(base_lr);
  optim_->Step();
  ZeroGrad();
}

void Replica::ZeroGrad() { optim_->ZeroGrad(); }

TensorMap Replica::ModelTensors() {
  TensorMap out;
  for (const auto& [name, t] : model_->NamedParameters()) out[name] = t.detach();
  for (const auto& [name, t] : model_->NamedBuffers()) out[name] = t.detach();
  return out;
}

TensorMap Replica::ModelState() {
  TensorMap out = ModelTensors();
  for (auto& [name, t] : out) t = t.cpu().clone();
  return out;
}

absl::Status Replica::Restore(const TensorMap& model, const TensorMap& optimizer) {
  RETURN_IF_ERROR(Catching("restoring the model", [&] {
    torch::NoGradGuard no_grad;
    NamedTensors all = model_->NamedParameters();
    for (auto& b : model_->NamedBuffers()) all.push_back(b);
    for (auto& [name, t] : all) {
      auto it = model.find(name);
      if (it == model.end()) throw std::runtime_error(absl::StrCat("no tensor for ", name));
      if (it->second.sizes() != t.sizes()) {
        throw std::runtime_error(absl::StrCat(name, " has shape ", c10::str(it->second.sizes()),
                                              ", the model expects ", c10::str(t.sizes())));
      }
      t.copy_(it->second.to(t.device(), t.scalar_type()));
    }
  }));
  RETURN_IF_ERROR(optim_->RestoreState(optimizer));
  ZeroGrad();
  return absl::OkStatus();
}

absl::StatusOr<std::string> Replica::SerializeState() {
  ckpt::TensorMap all;
  for (auto& [k, v] : ModelState()) all[kModelPrefix + k] = v;
  for (auto& [k, v] : OptimizerState()) all[kOptimPrefix + k] = v;
  return ckpt::SerializeSafetensors(all);
}

absl::Status Replica::LoadState(const std::string& bytes) {
  ASSIGN_OR_RETURN(ckpt::TensorMap all, ckpt::ParseSafetensors(bytes));
  TensorMap model, optimizer;
  for (auto& [k, v] : all) {
    if (absl::StartsWith(k, kModelPrefix)) model[k.substr(sizeof(kModelPrefix) - 1)] = v;
    if (absl::StartsWith(k, kOptimPrefix)) optimizer[k.substr(sizeof(kOptimPrefix) - 1)] = v;
  }
  return Restore(model, optimizer);
}

}  // namespace trainstep
