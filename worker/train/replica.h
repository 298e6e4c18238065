// Replica: this worker's copy of the model and optimizer, and the numerics of one
// window on it — micro-steps with the loss scaled once (S · loss_sum / N), gradients
// zero-filled so every rank enters the all-reduce, unscale + check after the all-reduce,
// and exactly the coordinator's decision applied. It makes no collective or RPC call.
#ifndef TRAINSTEP_WORKER_TRAIN_REPLICA_H_
#define TRAINSTEP_WORKER_TRAIN_REPLICA_H_

#include <ATen/ATen.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/allowed_roots.h"
#include "trainstep/v1/spec.pb.h"
#include "worker/data/collate.h"
#include "worker/models/model.h"
#include "worker/train/loss.h"
#include "worker/train/optim.h"

namespace torch::autograd {
struct Node;
}

namespace trainstep {

// Told during a micro-step's backward that a trainable gradient is final: `position` in
// Replica::BucketGradients() order, `grad` the parameter's .grad after its accumulation.
using GradientReadyFn = std::function<void(size_t position, const at::Tensor& grad)>;

struct GradientHookTarget;  // what a replica's gradient hooks call (replica.cc)

struct MicroStepTimes {
  double forward_seconds = 0.0;  // forward + loss
  double backward_seconds = 0.0;
  double data_seconds = 0.0;  // collating the micro-batch (the worker's, before MicroStep)
};

struct UnscaleResult {
  bool found_inf = false;
  double grad_norm = 0.0;  // of the unscaled gradients; not finite when found_inf
  // With a loss scaler: the norm of the same gradients before unscaling, S × grad_norm when
  // the order is right (the seeds' probe). Not finite when found_inf.
  std::optional<double> grad_norm_scaled;
};

class Replica {
 public:
  // Builds the spec's model (seeded; files it reads checked against `roots`) and optimizer
  // on `device`.
  static absl::StatusOr<std::unique_ptr<Replica>> Create(
      const v1::JobSpec& resolved, const at::Device& device,
      const AllowedRoots& roots = AllowedRoots());

  // One micro-batch: forward (under autocast for bf16/fp16), LossSum, and
  // backward(multiplier · LossSum). Gradients accumulate. Returns the unscaled LossSum.
  // With `on_ready` (and gradient_hooks()), each trainable gradient is passed to it as soon
  // as its accumulation in this backward is done, on the thread that runs it (on CPU, the
  // caller's), while the rest of backward runs; a parameter this backward does not reach is
  // not passed.
  absl::StatusOr<double> MicroStep(const data::MicroBatch& mb, double multiplier,
                                   MicroStepTimes* times = nullptr,
                                   const GradientReadyFn* on_ready = nullptr);

  // Held-out evaluation of one micro-batch: forward under the training precision's autocast,
  // no gradient, the model in eval mode; returns LossSum (the sum over its valid units).
  absl::StatusOr<double> EvalLossSum(const data::MicroBatch& mb);

  // The trainable gradients in parameter order (defined after ZeroGrad): the order of the
  // unscale, the norm and the optimizer.
  std::vector<at::Tensor> Gradients();
  // The same tensors in all-reduce bucket order: reverse parameter order, roughly the order
  // backward makes them final (as DDP buckets), so the first buckets can start early.
  std::vector<at::Tensor> BucketGradients();
  // Whether MicroStep can report gradients as they become final (a hook on every trainable
  // parameter's gradient accumulator); if not, gradient_hooks_missing() says why.
  bool gradient_hooks() const { return !accumulators_.empty(); }
  const std::string& gradient_hooks_missing() const { return hooks_missing_; }
  // A checksum of the bytes of every trainable gradient (FNV-1a, in parameter order): two runs
  // of a window agree on it iff their local gradients are bitwise equal (spec.validate).
  uint64_t GradientChecksum();
  // After the all-reduce: the scaled norm (with a loss scaler), gradients ×= 1/S, non-finite
  // check, global L2 norm (fp32).
  UnscaleResult UnscaleAndNorm(double loss_scale);

  // COMMIT: gradients ×= clip_coef, every group's lr = base_lr × its scale, step, zero.
  void Commit(double clip_coef, double base_lr);
  // SKIP / ABORT: nothing applied; no residue (inf, partial sums) reaches the next window.
  void ZeroGrad();

  // Model tensors (parameters and buffers, float32 on CPU) and optimizer state by name.
  TensorMap ModelState();
  TensorMap OptimizerState() const { return optim_->CaptureState(); }
  // The same names, but the live tensors on the device (for an asynchronous host copy).
  TensorMap ModelTensors();
  TensorMap OptimizerTensors() const { return optim_->StateTensors(); }
  absl::Status Restore(const TensorMap& model, const TensorMap& optimizer);
  // Both maps as one safetensors blob ("model/…", "optim/…") for a broadcast.
  absl::StatusOr<std::string> SerializeState();
  absl::Status LoadState(const std::string& bytes);

  bool token_level() const { return token_level_; }
  Model& model() { return *model_; }

 private:
  Replica() = default;
  // Forward (autocast) and LossSum, with the model's output checked. Throws (LibTorch).
  at::Tensor ForwardLossSum(const MicroBatchTensors& t);
  // A post-hook on each trainable parameter's AccumulateGrad node (what c10d's Reducer
  // hooks): it calls the MicroStep's on_ready, when there is one. Leaves none on failure.
  void RegisterGradientHooks();

  v1::JobSpec spec_;
  at::Device device_ = at::kCPU;
  bool token_level_ = true;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Optim> optim_;
  std::shared_ptr<GradientHookTarget> hook_target_;  // shared with the hooks
  // The hooked nodes: autograd holds a parameter's accumulator weakly, and would make a new
  // one, without the hook, for the next graph once the last graph using it is freed.
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  std::string hooks_missing_;  // why accumulators_ is empty
};

}  // namespace trainstep

#endif  // TRAINSTEP_WORKER_TRAIN_REPLICA_H_
