// The replica's optimizer: SGD or AdamW from LibTorch with the spec's param groups and
// frozen prefixes, and its state as named tensors (for checkpoints and broadcasts).
#ifndef TRAINSTEP_WORKER_TRAIN_OPTIM_H_
#define TRAINSTEP_WORKER_TRAIN_OPTIM_H_

#include <ATen/ATen.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "trainstep/v1/spec.pb.h"
#include "worker/models/model.h"

namespace torch::optim {
class Optimizer;
}

namespace trainstep {

using TensorMap = std::map<std::string, at::Tensor>;

struct TrainableParam {
  std::string name;
  at::Tensor tensor;
  double lr_scale = 1.0;
};

class Optim {
 public:
  // Frozen parameters get requires_grad(false) and join no group (docs/numerics.md, rule 13).
  // Every other parameter joins the group of its longest matching prefix (scale 1 otherwise).
  // Errors: a param_groups / frozen_prefixes entry that matches no parameter names the field.
  static absl::StatusOr<std::unique_ptr<Optim>> Build(const v1::JobSpec& resolved,
                                                      const NamedTensors& parameters);
  ~Optim();

  // The trainable parameters in the model's order: the order of all-reduce buckets.
  const std::vector<TrainableParam>& trainable() const { return trainable_; }
  const std::vector<std::string>& frozen() const { return frozen_; }

  // Every group's lr = base_lr × its lr_scale.
  void SetLearningRate(double base_lr);
  void Step();
  // Zeroes every trainable gradient; allocates zeros where there is none yet, so every rank
  // enters the all-reduce with the same tensors even if it trained nothing this window.
  void ZeroGrad();

  // "<param>.exp_avg", "<param>.exp_avg_sq", "<param>.step" (AdamW) or
  // "<param>.momentum_buffer" (SGD), for parameters that have state.
  TensorMap CaptureState() const;
  // The same names, but the live tensors where they are (the device): change with Step().
  TensorMap StateTensors() const;
  absl::Status RestoreState(const TensorMap& state);

 private:
  Optim() = default;

  bool adamw_ = false;
  std::vector<TrainableParam> trainable_;
  std::vector<std::string> frozen_;
  std::vector<double> group_scales_;  // by optimizer group
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
};

}  // namespace trainstep

#endif  // TRAINSTEP_WORKER_TRAIN_OPTIM_H_
