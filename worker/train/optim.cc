#include "worker/train/optim.h"

#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/version.h>

#include <type_traits>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace trainstep {
namespace {

// LibTorch keys an optimizer's per-parameter state by the parameter's TensorImpl: its address
// as a string in 1.13, the pointer itself in 2.x (c10::guts::to_string is gone there).
#if TORCH_VERSION_MAJOR >= 2
void* StateKey(const at::Tensor& p) { return p.unsafeGetTensorImpl(); }
#else
std::string StateKey(const at::Tensor& p) { return c10::guts::to_string(p.unsafeGetTensorImpl()); }
#endif
using StateMap =
    std::remove_reference_t<decltype(std::declval<torch::optim::Optimizer&>().state())>;
static_assert(std::is_same_v<StateMap::key_type, decltype(StateKey(std::declval<at::Tensor>()))>,
              "this LibTorch keys optimizer state differently: adapt StateKey");

}  // namespace

Optim::~Optim() = default;

absl::StatusOr<std::unique_ptr<Optim>> Optim::Build(const v1::JobSpec& resolved,
                                                    const NamedTensors& parameters) {
  std::unique_ptr<Optim> o(new Optim());
  const v1::Optimizer& spec = resolved.optimizer();
  o->adamw_ = spec.has_adamw();
  const int groups = spec.param_groups_size() + 1;  // 0 = default group
  std::vector<std::vector<at::Tensor>> members(groups);
  std::vector<bool> group_used(groups, false), frozen_used(spec.frozen_prefixes_size(), false);
  for (const auto& [name, tensor] : parameters) {
    bool frozen = false;
    for (int i = 0; i < spec.frozen_prefixes_size(); ++i) {
      if (absl::StartsWith(name, spec.frozen_prefixes(i))) {
        frozen = true;
        frozen_used[i] = true;
      }
    }
    if (frozen || !tensor.requires_grad()) {  // frozen by the spec, or inside the user's file
      tensor.set_requires_grad(false);
      o->frozen_.push_back(name);
      continue;
    }
    int group = 0;
    size_t best = 0;
    for (int i = 0; i < spec.param_groups_size(); ++i) {
      const std::string& prefix = spec.param_groups(i).prefix();
      if (absl::StartsWith(name, prefix) && prefix.size() > best) {
        best = prefix.size();
        group = i + 1;
      }
    }
    group_used[group] = true;
    members[group].push_back(tensor);
    o->trainable_.push_back(
        {name, tensor, group == 0 ? 1.0 : spec.param_groups(group - 1).lr_scale()});
  }
  for (int i = 0; i < spec.frozen_prefixes_size(); ++i) {
    if (!frozen_used[i]) {
      return absl::InvalidArgumentError(absl::StrCat("optimizer.frozen_prefixes[", i, "] \"",
                                                     spec.frozen_prefixes(i),
                                                     "\" matches no parameter of the model"));
    }
  }
  for (int i = 0; i < spec.param_groups_size(); ++i) {
    if (!group_used[i + 1]) {
      return absl::InvalidArgumentError(absl::StrCat("optimizer.param_groups[", i, "].prefix \"",
                                                     spec.param_groups(i).prefix(),
                                                     "\" matches no trainable parameter"));
    }
  }
  if (o->trainable_.empty()) {
    return absl::InvalidArgumentError("optimizer.frozen_prefixes freeze every parameter");
  }
  std::vector<torch::optim::OptimizerParamGroup> param_groups;
  for (int g = 0; g < groups; ++g) {
    if (members[g].empty()) continue;
    const double scale = g == 0 ? 1.0 : spec.param_groups(g - 1).lr_scale();
    o->group_scales_.push_back(scale);
    if (o->adamw_) {
      const v1::AdamW& a = spec.adamw();
      auto opts = std::make_unique<torch::optim::AdamWOptions>(a.lr() * scale);
      opts->betas({a.beta1(), a.beta2()}).eps(a.eps()).weight_decay(a.weight_decay());
      param_groups.emplace_back(members[g], std::move(opts));
    } else {
      const v1::Sgd& s = spec.sgd();
      auto opts = std::make_unique<torch::optim::SGDOptions>(s.lr() * scale);
      opts->momentum(s.momentum()).weight_decay(s.weight_decay());
      param_groups.emplace_back(members[g], std::move(opts));
    }
  }
  if (o->adamw_) {
    o->optimizer_ = std::make_unique<torch::optim::AdamW>(param_groups);
  } else {
    o->optimizer_ = std::make_unique<torch::optim::SGD>(param_groups,
                                                        torch::optim::SGDOptions(spec.sgd().lr()));
  }
  return o;
}

void Optim::SetLearningRate(double base_lr) {
  auto& groups = optimizer_->param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    const double lr = base_lr * group_scales_[g];
    if (adamw_) {
      static_cast<torch::optim::AdamWOptions&>(groups[g].options()).lr(lr);
    } else {
      static_cast<torch::optim::SGDOptions&>(groups[g].options()).lr(lr);
    }
  }
}

void Optim::Step() { optimizer_->step(); }

void Optim::ZeroGrad() {
  for (TrainableParam& p : trainable_) {
    at::Tensor& g = p.tensor.mutable_grad();
    if (g.defined()) {
      g.zero_();
    } else {
      g = at::zeros_like(p.tensor);
    }
  }
}

TensorMap Optim::StateTensors() const {
  TensorMap out;
  const auto& state = optimizer_->state();
  for (const TrainableParam& p : trainable_) {
    auto it = state.find(StateKey(p.tensor));
    if (it == state.end()) continue;
    if (adamw_) {
      const auto& s = static_cast<const torch::optim::AdamWParamState&>(*it->second);
      out[p.name + ".exp_avg"] = s.exp_avg().detach();
      out[p.name + ".exp_avg_sq"] = s.exp_avg_sq().detach();
      out[p.name + ".step"] = at::scalar_tensor(s.step(), at::kLong);
    } else {
      const auto& s = static_cast<const torch::optim::SGDParamState&>(*it->second);
      if (s.momentum_buffer().defined()) {
        out[p.name + ".momentum_buffer"] = s.momentum_buffer().detach();
      }
    }
  }
  return out;
}

TensorMap Optim::CaptureState() const {
  TensorMap out = StateTensors();
  for (auto& [name, t] : out) t = t.cpu().clone();
  return out;
}

absl::Status Optim::RestoreState(const TensorMap& state) {
  auto& slots = optimizer_->state();
  slots.clear();
  auto take = [&](const std::string& key, const at::Tensor& like) -> absl::StatusOr<at::Tensor> {
    auto it = state.find(key);
    if (it == state.end()) return at::Tensor();
    if (it->second.sizes() != like.sizes()) {
      return absl::InvalidArgumentError(absl::StrCat("optimizer state ", key, " has shape ",
                                                     c10::str(it->second.sizes()), ", parameter ",
                                                     c10::str(like.sizes())));
    }
    return it->second.to(like.device(), like.scalar_type()).clone();
  };
  for (const TrainableParam& p : trainable_) {
    if (adamw_) {
      auto step = state.find(p.name + ".step");
      if (step == state.end()) continue;  // no step taken yet for this parameter
      absl::StatusOr<at::Tensor> m = take(p.name + ".exp_avg", p.tensor);
      absl::StatusOr<at::Tensor> v = take(p.name + ".exp_avg_sq", p.tensor);
      if (!m.ok()) return m.status();
      if (!v.ok()) return v.status();
      if (!m->defined() || !v->defined()) {
        return absl::InvalidArgumentError(
            absl::StrCat("optimizer state of ", p.name, " has a step but no exp_avg/exp_avg_sq"));
      }
      auto s = std::make_unique<torch::optim::AdamWParamState>();
      s->step(step->second.item<int64_t>());
      s->exp_avg(*m);
      s->exp_avg_sq(*v);
      slots[StateKey(p.tensor)] = std::move(s);
    } else {
      absl::StatusOr<at::Tensor> buf = take(p.name + ".momentum_buffer", p.tensor);
      if (!buf.ok()) return buf.status();
      if (!buf->defined()) continue;
      auto s = std::make_unique<torch::optim::SGDParamState>();
      s->momentum_buffer(*buf);
      slots[StateKey(p.tensor)] = std::move(s);
    }
  }
  return absl::OkStatus();
}

}  // namespace trainstep
