#include "worker/models/activation_checkpoint.h"

#include <ATen/core/Generator.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cstdint>
#include <mutex>
#include <utility>

#include "worker/train/amp.h"

namespace trainstep {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The generators a block on `device` may draw from: the CPU's, and the device's own.
std::vector<at::Generator> Generators(const at::Device& device) {
  std::vector<at::Generator> out = {at::globalContext().defaultGenerator(at::kCPU)};
  if (!device.is_cpu()) out.push_back(at::globalContext().defaultGenerator(device));
  return out;
}

// A generator's state is read and written under the generator's own lock, a c10 (std) mutex:
// PyTorch's, not one of trainstep's.
at::Tensor StateOf(at::Generator& generator) {
  const std::lock_guard lock(generator.mutex());
  return generator.get_state();
}

void SetState(at::Generator& generator, const at::Tensor& state) {
  const std::lock_guard lock(generator.mutex());
  generator.set_state(state);
}

struct Checkpointed : public torch::autograd::Function<Checkpointed> {
  static at::Tensor forward(AutogradContext* ctx, const BlockFn* block, at::TensorList inputs) {
    // The block must outlive the graph; the models keep theirs for their lifetime.
    ctx->saved_data["block"] = reinterpret_cast<int64_t>(block);
    const AutocastState autocast = CurrentAutocast();
    ctx->saved_data["cpu"] = autocast.cpu;
    ctx->saved_data["cuda"] = autocast.cuda;
    ctx->saved_data["cpu_dtype"] = static_cast<int64_t>(autocast.cpu_dtype);
    ctx->saved_data["cuda_dtype"] = static_cast<int64_t>(autocast.cuda_dtype);
    const at::Device device = inputs[0].device();
    std::vector<at::Tensor> rng;
    for (at::Generator& g : Generators(device)) rng.push_back(StateOf(g));
    ctx->saved_data["rng"] = rng;
    ctx->save_for_backward(inputs.vec());
    return (*block)(inputs.vec());  // grad mode is off here: nothing is kept
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto* block = reinterpret_cast<const BlockFn*>(ctx->saved_data["block"].toInt());
    AutocastState autocast;
    autocast.cpu = ctx->saved_data["cpu"].toBool();
    autocast.cuda = ctx->saved_data["cuda"].toBool();
    autocast.cpu_dtype = static_cast<at::ScalarType>(ctx->saved_data["cpu_dtype"].toInt());
    autocast.cuda_dtype = static_cast<at::ScalarType>(ctx->saved_data["cuda_dtype"].toInt());
    const std::vector<at::Tensor> rng = ctx->saved_data["rng"].toTensorVector();

    std::vector<at::Tensor> inputs;
    for (const at::Tensor& saved : ctx->get_saved_variables()) {
      inputs.push_back(saved.detach().requires_grad_(saved.requires_grad()));
    }
    at::Tensor output;
    {
      // The forward's random numbers again, and the generators left as the backward found them.
      std::vector<at::Generator> generators = Generators(inputs[0].device());
      std::vector<at::Tensor> now;
      for (size_t i = 0; i < generators.size(); ++i) {
        now.push_back(StateOf(generators[i]));
        SetState(generators[i], rng[i]);
      }
      at::AutoGradMode grad(true);
      AutocastReplay replay(autocast);
      output = (*block)(inputs);
      for (size_t i = 0; i < generators.size(); ++i) SetState(generators[i], now[i]);
    }
    torch::autograd::backward({output}, {grad_outputs[0]});
    variable_list grads = {at::Tensor()};  // the block: not a tensor
    for (const at::Tensor& input : inputs) {
      grads.push_back(input.requires_grad() ? input.grad() : at::Tensor());
    }
    return grads;
  }
};

}  // namespace

at::Tensor RunBlock(const BlockFn& block, const std::vector<at::Tensor>& inputs, bool checkpoint) {
  bool any_grad = false;
  for (const at::Tensor& t : inputs) any_grad = any_grad || t.requires_grad();
  if (!checkpoint || !at::GradMode::is_enabled() || !any_grad) return block(inputs);
  return Checkpointed::apply(&block, at::TensorList(inputs));
}

}  // namespace trainstep
