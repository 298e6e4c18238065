// Activation checkpointing (worker/models/activation_checkpoint.h) held to the plain forward and
// backward it replaces: the same gradients, under autocast and with randomness in the block.
#include "worker/models/activation_checkpoint.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <vector>

#include "core/llama_config.h"
#include "worker/models/llama.h"
#include "worker/train/amp.h"

namespace trainstep {
namespace {

LlamaConfig SmallLlama() {
  LlamaConfig c;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.vocab_size = 50;
  c.qkv_bias = true;
  c.source_dtype = "float32";
  return c;
}

// Every parameter's gradient after one forward (under `precision`'s autocast) and backward.
std::vector<at::Tensor> Gradients(bool checkpoint, v1::JobSpec::Precision precision) {
  torch::manual_seed(5);
  std::unique_ptr<Model> model = NewLlama(SmallLlama(), LlamaInit::kRandom, checkpoint);
  const at::Tensor ids = torch::randint(0, 50, {2, 9}, torch::kLong);
  at::Tensor loss;
  {
    AutocastScope autocast(precision, at::kCPU);
    loss = model->Forward(ids).to(at::kFloat).logsumexp(-1).mean();
  }
  loss.backward();
  std::vector<at::Tensor> grads;
  for (const auto& [name, p] : model->NamedParameters()) {
    EXPECT_TRUE(p.grad().defined()) << name;
    grads.push_back(p.grad().clone());
  }
  return grads;
}

void ExpectSame(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(at::equal(a[i], b[i]))
        << "parameter " << i << ": max |diff| " << (a[i] - b[i]).abs().max().item<double>();
  }
}

// Catches a recomputation that differs from the forward (another input, a lost or doubled
// parameter gradient): fp32 gradients equal the plain backward's exactly.
TEST(ActivationCheckpointTest, Fp32GradientsEqualThePlainBackward) {
  ExpectSame(Gradients(true, v1::JobSpec::fp32), Gradients(false, v1::JobSpec::fp32));
}

// Catches a recomputation outside the forward's autocast (backward runs outside the scope): it
// would compute the block in fp32 and give other gradients than the bf16 forward's.
TEST(ActivationCheckpointTest, Bf16GradientsEqualThePlainBackward) {
  const std::vector<at::Tensor> plain = Gradients(false, v1::JobSpec::bf16);
  ExpectSame(Gradients(true, v1::JobSpec::bf16), plain);
  const std::vector<at::Tensor> fp32 = Gradients(false, v1::JobSpec::fp32);
  double differs = 0;
  for (size_t i = 0; i < plain.size(); ++i) {
    differs = std::max(differs, (plain[i] - fp32[i]).abs().max().item<double>());
  }
  EXPECT_GT(differs, 0) << "bf16 and fp32 give the same gradients: the test could not fail";
}

// Catches a recomputation that draws other random numbers than the forward (a dropout mask):
// its gradients would not match the plain backward's; and the generator, afterwards, is where
// the plain run leaves it.
TEST(ActivationCheckpointTest, RandomnessIsReplayed) {
  torch::nn::Linear linear(8, 8);
  const BlockFn block = [&](const std::vector<at::Tensor>& in) {
    return at::dropout(linear(in[0]), 0.5, /*train=*/true);
  };
  auto run = [&](bool checkpoint) {
    linear->zero_grad();
    torch::manual_seed(11);
    at::Tensor x = torch::randn({4, 8}).requires_grad_(true);
    RunBlock(block, {x}, checkpoint).pow(2).sum().backward();
    return std::vector<at::Tensor>{linear->weight.grad().clone(), x.grad().clone(),
                                   torch::rand({1})};
  };
  ExpectSame(run(true), run(false));
}

// Catches a checkpointed block whose input needs no gradient (everything before it frozen):
// the custom function would never run backward and the block's parameters would get none.
TEST(ActivationCheckpointTest, BlockAfterFrozenInputsStillGetsGradients) {
  torch::nn::Linear linear(4, 4);
  const BlockFn block = [&](const std::vector<at::Tensor>& in) { return linear(in[0]); };
  RunBlock(block, {torch::ones({2, 4})}, /*checkpoint=*/true).sum().backward();
  ASSERT_TRUE(linear->weight.grad().defined());
  EXPECT_GT(linear->weight.grad().abs().sum().item<double>(), 0);
}

}  // namespace
}  // namespace trainstep
