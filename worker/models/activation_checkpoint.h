// Activation checkpointing for the built-in transformers: a block's forward keeps none of its
// activations, and backward runs it again to get them. LibTorch's C++ API has no checkpoint
// helper, so this is torch.utils.checkpoint's reentrant form as a custom autograd function:
// the recomputation runs under the autocast state and from the random-number state the forward
// saw, so it computes the same values, and its backward adds the block's parameter gradients
// into .grad as an ordinary backward does.
#ifndef TRAINSTEP_WORKER_MODELS_ACTIVATION_CHECKPOINT_H_
#define TRAINSTEP_WORKER_MODELS_ACTIVATION_CHECKPOINT_H_

#include <ATen/ATen.h>

#include <functional>
#include <vector>

namespace trainstep {

// A block's forward over its inputs (the hidden state first, then e.g. rotary tables).
using BlockFn = std::function<at::Tensor(const std::vector<at::Tensor>& inputs)>;

// `block(inputs)`, checkpointed when `checkpoint` is true, grad mode is on and an input
// requires grad. Without such an input (every earlier parameter frozen) the block runs as it
// is: a checkpoint there would give its parameters no gradient. `block` must outlive the
// backward of the result (the models keep one per layer).
at::Tensor RunBlock(const BlockFn& block, const std::vector<at::Tensor>& inputs, bool checkpoint);

}  // namespace trainstep

#endif  // TRAINSTEP_WORKER_MODELS_ACTIVATION_CHECKPOINT_H_
