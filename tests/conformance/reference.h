// The reference the conformance suite holds trainstep to: a plain LibTorch training loop in
// the test process, no coordinator, no collective, no accumulation — each window's samples
// in ONE forward/backward with a mean loss over the window's units (tokens or samples), the
// same torch::optim optimizer built here, torch::nn::utils::clip_grad_norm_, and the lr from
// the closed form of coordinator/lr_schedule.h written out again here.
//
// It shares with the worker only what defines "the same job": the seeded model (BuildModel)
// and which samples each window holds (Dataset, WindowPlanner, Collate). It does not use the
// worker's loss, replica, optimizer, amp or window code. Torch-free header.
#ifndef TRAINSTEP_TESTS_CONFORMANCE_REFERENCE_H_
#define TRAINSTEP_TESTS_CONFORMANCE_REFERENCE_H_

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tests/conformance/harness.h"

namespace trainstep::conformance {

struct ReferenceOptions {
  // Windows whose update is thrown away (an injected overflow): nothing changes, and the
  // scheduler does not advance.
  std::set<int64_t> skip_windows;
};

struct ReferenceUpdate {
  int64_t window_id = 0;
  int64_t units = 0;         // tokens or samples of the whole window
  double loss = 0.0;         // mean over the window's units
  double grad_norm = 0.0;    // before clipping (clip_grad_norm_'s return value)
  double clip_coef = 1.0;    // min(1, max_norm / (norm + 1e-6)); 1 without clipping
  double learning_rate = 0;  // base lr × schedule factor
};

struct ReferenceRun {
  Params initial;
  std::vector<Params> after_update;  // [k] = parameters after update k + 1
  Params final_params;
  std::vector<ReferenceUpdate> updates;
  std::vector<int64_t> empty_windows;  // windows with no trainable unit (not trained)
};

// Runs the job `spec_json` describes (parsed and resolved as the coordinator does), with its
// stop rule (stop.max_updates committed updates / stop.epochs over the planner's windows).
// Only the loss normalisation of the spec is ignored: the reference is always the mean over
// the window's units.
absl::StatusOr<ReferenceRun> RunReference(const std::string& spec_json,
                                          const ReferenceOptions& options = {});

// The model tensors of checkpoint dir/ckpt-<id> (float32), and its optimizer_update_id.
absl::StatusOr<Params> CheckpointParams(const std::string& dir, int64_t checkpoint_id,
                                        int64_t* optimizer_update_id = nullptr);
// The same for the highest complete checkpoint of `dir`.
absl::StatusOr<Params> LatestCheckpointParams(const std::string& dir,
                                              int64_t* optimizer_update_id = nullptr,
                                              int64_t* checkpoint_id = nullptr);

// The tensors of a safetensors file (an independent implementation's output) as float32.
absl::StatusOr<Params> SafetensorsParams(const std::string& path);

// The logits ("logits", [B, T, V]) of the model `spec_json` describes, built as the worker
// builds it (BuildModel), for token ids `ids` (B rows of T), in fp32 without autograd.
absl::StatusOr<Params> ModelLogits(const std::string& spec_json,
                                   const std::vector<std::vector<int64_t>>& ids);

// The held-out loss of the job's spec.eval, recomputed apart from the worker: the model built
// from the spec with `params` copied in, then every held-out sample (the first
// eval.max_batches × micro_batch_size when set) in its OWN forward pass in fp32, cross-entropy
// summed over its valid next-token labels; loss = Σ / Σ tokens. Token-level data only. Also
// the mean of per-micro-batch means, the number the token weighting must not be confused with.
struct ReferenceEval {
  double loss = 0.0;
  int64_t tokens = 0;
  double mean_of_micro_batch_means = 0.0;
};
absl::StatusOr<ReferenceEval> ReferenceEvalLoss(const std::string& spec_json, const Params& params);

// CUDA devices the worker processes can train on: 0 without a GPU, or when the worker is
// built without its CUDA path (TRAINSTEP_WITH_CUDA).
int WorkerCudaDevices();

// The lr multiplier of the closed form (warmup (s+1)/W, then cosine or linear to min ratio).
double ReferenceLrFactor(const std::string& spec_json, int64_t scheduler_step);

}  // namespace trainstep::conformance

#endif  // TRAINSTEP_TESTS_CONFORMANCE_REFERENCE_H_
