// A model directory in Hugging Face layout, as the ecosystem's tools write it:
//
//   dir/config.json + dir/model.safetensors
//   dir/config.json + dir/model.safetensors.index.json + the shards its weight_map names
//
// The safetensors files are memory-mapped, not read: a loader copies each tensor straight
// from the mapping into its parameter, so loading holds about one copy of the weights (the
// parameters) plus pages the kernel can drop. Torch-free: the caller makes the tensors.
#ifndef TRAINSTEP_COMMON_HF_WEIGHTS_H_
#define TRAINSTEP_COMMON_HF_WEIGHTS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/allowed_roots.h"
#include "common/safetensors_format.h"

namespace trainstep {

// config.json and the index are small; a larger one is not a model's.
inline constexpr size_t kMaxHfJsonBytes = 64 << 20;

inline constexpr char kHfSingleFile[] = "model.safetensors";
inline constexpr char kHfIndexFile[] = "model.safetensors.index.json";
// transformers' default max_shard_size, "5GB".
inline constexpr uint64_t kHfDefaultMaxShardBytes = 5'000'000'000;

// The name of shard `index` (1-based) of `count`: "model-00001-of-00003.safetensors".
std::string HfShardFileName(int index, int count);

// Tensors of these sizes, in this order, split as transformers splits a state dict: a shard is
// closed when the next tensor would take it over `max_bytes`, so a tensor larger than the limit
// gets a shard of its own. The 0-based shard of each tensor.
std::vector<int> PlanHfShards(const std::vector<uint64_t>& sizes, uint64_t max_bytes);

// model.safetensors.index.json's text: {"metadata": {"total_size": N}, "weight_map": {...}}.
std::string HfIndexJson(uint64_t total_size, const std::map<std::string, std::string>& weight_map);

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
  // The same without config.json (config_json() is empty): the weights of a checkpoint.
  static absl::StatusOr<std::unique_ptr<HfWeights>> OpenTensors(const std::string& dir,
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

  // Drops the pages of `bytes` (part of a tensor's) from this process, but the page its end
  // shares with what follows: a multi-GB input read once does not stay resident. The pages are
  // clean and read back from the file if touched again.
  static void ReleasePages(absl::string_view bytes);

 private:
  struct Mapping {
    const char* data = nullptr;
    size_t size = 0;
  };
  HfWeights() = default;
  static absl::StatusOr<std::unique_ptr<HfWeights>> OpenDir(const std::string& dir,
                                                            const AllowedRoots& roots,
                                                            absl::string_view field);
  // model.safetensors, or the index and its shards.
  absl::Status AddWeights(const AllowedRoots& roots, absl::string_view field);
  absl::Status AddFile(const std::string& name, const AllowedRoots& roots, absl::string_view field);

  std::string dir_;
  std::string config_json_;
  std::vector<Mapping> mappings_;
  std::map<std::string, Tensor> tensors_;
};

}  // namespace trainstep

#endif  // TRAINSTEP_COMMON_HF_WEIGHTS_H_
