// The samples of a job: read once from the files (or generated) that a resolved JobSpec
// names, then immutable. No LibTorch: tensors are made from these vectors by the caller.
#ifndef TRAINSTEP_WORKER_DATA_DATASET_H_
#define TRAINSTEP_WORKER_DATA_DATASET_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/allowed_roots.h"
#include "trainstep/v1/spec.pb.h"

namespace trainstep::data {

// The label of a position that is not trained (padding, prompt), as in PyTorch's
// cross_entropy(ignore_index=-100).
inline constexpr int32_t kIgnoreLabel = -100;

// One training example. Token-level data (text, jsonl, tokens) fills input_ids and labels (same
// length ≥ 1); sample-level data (synthetic_regression) fills features and targets.
struct Sample {
  std::vector<int32_t> input_ids;
  std::vector<int32_t> labels;  // kIgnoreLabel = not trained
  std::vector<float> features;
  std::vector<float> targets;
};

class TokenFile;

// Tokens that enter a causal LM loss: labels[1:] that are not kIgnoreLabel. Position t
// predicts labels[t+1], so labels[0] is never a target and a 1-token sample has none.
int64_t ValidTokens(const Sample& s);

// The samples of a job, in file order. Immutable after Load, so thread-safe; cheap to move,
// expensive to copy (copying is allowed but rarely wanted). Samples are held in memory, or,
// for data.tokens, cut on demand from a memory-mapped file (worker/data/tokens.h).
class Dataset {
 public:
  // Loads the data of a RESOLVED spec (see ResolveJobSpec) whose model's vocabulary is known
  // (ModelVocabSize: a model.torchscript's is recorded once the model is loaded, else
  // FAILED_PRECONDITION); token ids are checked against it:
  //   text: every regular file under data.text.paths (directories recursively), sorted by
  //     full path, each read once, as one byte stream (token = byte) cut into samples of
  //     data.text.seq_len tokens; a last partial sample is kept if it has ≥ 2 tokens. A
  //     model with a vocabulary < 256 rejects bytes it has no id for.
  //   jsonl: one {"input_ids": [...], "labels": [...]} object a line; blank lines skipped;
  //     labels default to input_ids; other keys ignored.
  //   tokens: data.tokens.path memory-mapped; sample i is the seq_len + 1 ids from id
  //     i·seq_len on (see tokens.h); the whole file is checked against the vocabulary first.
  //   synthetic_regression: x ~ N(0, 1), y = W x + 0.1·sin(x₀), W ~ N(0, 1/in_features),
  //     from the spec's seed; sample i does not depend on data.synthetic_regression.samples.
  // Errors name the field or the file and line:
  //   NOT_FOUND "data.text.paths[1]: /x/y does not exist"
  //   INVALID_ARGUMENT "/data/train.jsonl:17: labels has 12 entries, input_ids 13"
  // An empty dataset is INVALID_ARGUMENT. Every file read must lie within `roots` (each file
  // found in a data directory too, so a symlink in it cannot lead outside):
  //   PERMISSION_DENIED "data.text.paths[0]: /data/d/link (resolves to /etc/shadow) is
  //   outside this worker's --allowed-roots /data"
  static absl::StatusOr<Dataset> Load(const v1::JobSpec& resolved,
                                      const AllowedRoots& roots = AllowedRoots());

  // A dataset of the given samples, for tests and tools: token-level when the first sample
  // has input_ids. The samples are not validated.
  static Dataset FromSamples(std::vector<Sample> samples);

  int64_t size() const;
  // 0 ≤ i < size(). A copy: a token file's samples exist only as they are read.
  Sample at(int64_t i) const;
  bool token_level() const { return token_level_; }
  // 16 lowercase hex digits: FNV-1a 64 over every sample's content and lengths, in order
  // (a token file: XXH64 over every byte of it and its layout, TokenFile::Fingerprint).
  // Equal data ⇔ equal fingerprint (up to hash collisions); every worker reports it so the
  // coordinator can refuse a worker that read different files.
  const std::string& fingerprint() const { return fingerprint_; }

 private:
  Dataset(std::vector<Sample> samples, bool token_level);
  explicit Dataset(std::shared_ptr<const TokenFile> tokens);

  std::vector<Sample> samples_;
  std::shared_ptr<const TokenFile> tokens_;  // non-null iff the samples come from a token file
  bool token_level_ = true;
  std::string fingerprint_;  // of samples_ or tokens_, computed once
};

// Σ ValidTokens over the listed samples: a rank's n_r for BeginWindow, before any forward.
int64_t ValidTokens(const Dataset& data, const std::vector<int64_t>& indices);

}  // namespace trainstep::data

#endif  // TRAINSTEP_WORKER_DATA_DATASET_H_
