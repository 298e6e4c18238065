#include "worker/train/loss.h"

#include <cstring>

namespace trainstep {

MicroBatchTensors ToTensors(const data::MicroBatch& mb, bool token_level,
                            const at::Device& device) {
  MicroBatchTensors t;
  auto copy = [&](const auto& v, at::ScalarType type, std::vector<int64_t> shape) {
    at::Tensor cpu = at::empty(shape, at::TensorOptions().dtype(type));
    std::memcpy(cpu.data_ptr(), v.data(), v.size() * sizeof(v[0]));
    return cpu.to(device);
  };
  if (token_level) {
    t.input = copy(mb.input_ids, at::kLong, {mb.rows, mb.length});
    t.labels = copy(mb.labels, at::kLong, {mb.rows, mb.length});
    t.units = mb.valid_tokens;
  } else {
    t.input = copy(mb.features, at::kFloat, {mb.rows, mb.feature_dim});
    t.targets = copy(mb.targets, at::kFloat, {mb.rows, mb.target_dim});
    t.units = mb.samples;
  }
  return t;
}

at::Tensor LossSum(const at::Tensor& output, const MicroBatchTensors& mb, bool token_level) {
  if (token_level) {
    const int64_t vocab = output.size(2);
    // Position t predicts token t+1. The loss is computed in fp32 even under autocast.
    at::Tensor logits = output.narrow(1, 0, output.size(1) - 1).reshape({-1, vocab}).to(at::kFloat);
    at::Tensor labels = mb.labels.narrow(1, 1, mb.labels.size(1) - 1).reshape({-1});
    return at::cross_entropy_loss(logits, labels, /*weight=*/{}, at::Reduction::Sum,
                                  /*ignore_index=*/-100);
  }
  at::Tensor diff = output.to(at::kFloat) - mb.targets;
  return diff.pow(2).mean(/*dim=*/1).sum();
}

double BackwardMultiplier(v1::Loss::Normalization normalization, double loss_scale,
                          int64_t global_units, int64_t micro_units, int64_t accumulation_steps,
                          int64_t world_size) {
  if (normalization == v1::Loss::microbatch_mean) {
    if (micro_units == 0) return 0.0;
    return loss_scale / (static_cast<double>(micro_units) * accumulation_steps * world_size);
  }
  return loss_scale / static_cast<double>(global_units);
}

}  // namespace trainstep
