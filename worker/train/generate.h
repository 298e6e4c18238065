// Text from a checkpoint of a byte-level language model (tiny_gpt or a TorchScript LM):
// what `trainstep-worker --generate` prints so a person can see the model learned.
#ifndef TRAINSTEP_WORKER_TRAIN_GENERATE_H_
#define TRAINSTEP_WORKER_TRAIN_GENERATE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace trainstep {

struct GenerateOptions {
  std::string checkpoint;  // a ckpt-<id> directory; the resolved spec is read from ../spec.json
  std::string prompt = "The ";
  int tokens = 200;
  double temperature = 0.8;
  int top_k = 20;
  uint64_t seed = 1;
};

// Samples `tokens` bytes after the prompt (sliding the model's context window).
absl::StatusOr<std::string> Generate(const GenerateOptions& options);

// Where the worker keeps the resolved spec beside its checkpoints.
std::string SpecPathFor(const std::string& checkpoint_dir_root);

}  // namespace trainstep

#endif  // TRAINSTEP_WORKER_TRAIN_GENERATE_H_
