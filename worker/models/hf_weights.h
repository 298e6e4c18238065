// A model directory in Hugging Face layout, as the ecosystem's tools write it:
//
//   dir/config.json + dir/model.safetensors
//   dir/config.json + dir/model.safetensors.index.json + the shards its weight_map names
//
// The safetensors files are memory-mapped, not read: a loader copies each tensor straight
// from the mapping into its parameter, so loading holds about one copy of the weights (the
// parameters) plus pages the kernel can drop. Torch-free: the caller makes the tensors.
#ifndef TRAINSTEP_WORKER_MODELS_HF_WEIGHTS_H_
#define TRAINSTEP_WORKER_MODELS_HF_WEIGHTS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/allowed_roots.h"
#include "worker/checkpoint/safetensors_format.h"

namespace trainstep {

// config.json and the index are small; a larger one is not a model's.
inline constexpr size_t kMaxHfJsonBytes = 64 << 20;

class HfWeights {
 public:
  struct Tensor {
    std::string file;  // the safetensors file that holds it (for messages)
    ckpt::SafetensorsDtype dtype = ckpt::SafetensorsDtype::kF32;
    std::vector<int64_t> shape;
    absl::string_view bytes;  // inside the mapping; valid while this object lives
  };

  // Opens `dir`: reads config.json and the index, maps and validates every safetensors file
  // (ckpt::ParseSafetensorsHeader: hostile files are refused before anything is used). Every
  // file is checked against `roots` before it is opened (a symlink in the directory could
  // point anywhere). Errors name `field` and the file: a missing config.json, shard or
  // tensor of the index, a truncated or malformed file, a tensor named twice.
  static absl::StatusOr<std::unique_ptr<HfWeights>> Open(const std::string& dir,
                                                         const AllowedRoots& roots,
                                                         absl::string_view field);
  ~HfWeights();
  HfWeights(const HfWeights&) = delete;
  HfWeights& operator=(const HfWeights&) = delete;

  const std::string& dir() const { return dir_; }
  const std::string& config_json() const { return config_json_; }
  // Every tensor of every file, by name.
  const std::map<std::string, Tensor>& tensors() const { return tensors_; }
  // The sum of the tensors' sizes in bytes.
  uint64_t total_bytes() const;

 private:
  struct Mapping {
    const char* data = nullptr;
    size_t size = 0;
  };
  HfWeights() = default;
  absl::Status AddFile(const std::string& name, const AllowedRoots& roots, absl::string_view field);

  std::string dir_;
  std::string config_json_;
  std::vector<Mapping> mappings_;
  std::map<std::string, Tensor> tensors_;
};

}  // namespace trainstep

#endif  // TRAINSTEP_WORKER_MODELS_HF_WEIGHTS_H_
