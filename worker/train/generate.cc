#include "worker/train/generate.h"

#include <torch/csrc/api/include/torch/utils.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "core/spec.h"
#include "worker/checkpoint/checkpoint_dir.h"
#include "worker/models/model.h"

namespace trainstep {

std::string SpecPathFor(const std::string& checkpoint_dir_root) {
  return (std::filesystem::path(checkpoint_dir_root) / "spec.json").string();
}

absl::StatusOr<std::string> Generate(const GenerateOptions& options) {
  const std::filesystem::path ckpt = std::filesystem::path(options.checkpoint).lexically_normal();
  const std::filesystem::path root =
      ckpt.has_filename() ? ckpt.parent_path() : ckpt.parent_path().parent_path();
  const std::string spec_path = SpecPathFor(root.string());
  std::ifstream in(spec_path);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("no ", spec_path, ": --checkpoint must be a ckpt-<id> ",
                                            "directory written by trainstep-worker"));
  }
  std::stringstream text;
  text << in.rdbuf();
  ASSIGN_OR_RETURN(v1::JobSpec spec, ParseAndResolveJobSpec(text.str()));
  if (!IsTokenLevel(spec)) {
    return absl::FailedPreconditionError(
        "--generate needs a language model (tiny_gpt or torchscript)");
  }
  const std::string name =
      ckpt.filename().empty() ? ckpt.parent_path().filename().string() : ckpt.filename().string();
  int64_t id = 0;
  if (name.rfind("ckpt-", 0) != 0 || !(std::istringstream(name.substr(5)) >> id)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--checkpoint ", options.checkpoint, " is not a ckpt-<id> directory"));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Model> model, BuildModel(spec));
  if (model->VocabSize() != 256) {
    // Prompt and output are bytes; ids of another tokenizer would print as garbage. Asked of
    // the model: a TorchScript model's vocabulary is its own.
    return absl::FailedPreconditionError(absl::StrCat(
        "--generate reads and prints bytes: it needs a byte-level model (vocab_size 256), got "
        "vocab_size ",
        model->VocabSize()));
  }
  ASSIGN_OR_RETURN(ckpt::LoadedCheckpoint loaded, ckpt::ReadCheckpoint(root.string(), id));
  // Samples of seq_len tokens train predictions at positions 0..seq_len-2 only (the last
  // position has no next token), so generation never reads the untrained last position.
  const int64_t seq_len = spec.model().has_tiny_gpt() ? spec.model().tiny_gpt().seq_len()
                          : spec.data().has_text()    ? spec.data().text().seq_len()
                          : spec.data().has_tokens()  ? spec.data().tokens().seq_len() + 1
                                                      : 256;
  const int64_t context = std::max<int64_t>(1, seq_len - 1);
  std::string out = options.prompt;
  try {
    torch::NoGradGuard no_grad;
    NamedTensors all = model->NamedParameters();
    for (auto& b : model->NamedBuffers()) all.push_back(b);
    for (auto& [n, t] : all) {
      auto it = loaded.model.find(n);
      if (it == loaded.model.end())
        return absl::DataLossError(absl::StrCat("checkpoint lacks ", n));
      t.copy_(it->second);
    }
    model->SetTraining(false);
    torch::manual_seed(options.seed);
    std::vector<int64_t> ids(out.begin(), out.end());
    for (int64_t& b : ids) b &= 0xff;
    if (ids.empty()) ids.push_back(' ');
    if (ids.size() >= 2) {
      // How well the model predicts the prompt itself: the loss the training log reports.
      const int64_t start = std::max<int64_t>(0, static_cast<int64_t>(ids.size()) - context);
      at::Tensor input =
          at::tensor(std::vector<int64_t>(ids.begin() + start, ids.end()), at::kLong).unsqueeze(0);
      at::Tensor logits = model->Forward(input).squeeze(0).to(at::kFloat);
      const int64_t t = input.size(1);
      const double loss =
          at::cross_entropy_loss(logits.narrow(0, 0, t - 1), input.squeeze(0).narrow(0, 1, t - 1))
              .item<double>();
      LogInfo(absl::StrFormat("prompt loss %.3f nats/byte over %d bytes", loss, t - 1));
    }
    for (int i = 0; i < options.tokens; ++i) {
      const int64_t start = std::max<int64_t>(0, static_cast<int64_t>(ids.size()) - context);
      at::Tensor input =
          at::tensor(std::vector<int64_t>(ids.begin() + start, ids.end()), at::kLong).unsqueeze(0);
      at::Tensor logits =
          model->Forward(input).select(1, input.size(1) - 1).squeeze(0).to(at::kFloat);
      logits = logits / std::max(1e-3, options.temperature);
      if (options.top_k > 0 && options.top_k < logits.size(0)) {
        at::Tensor kth = std::get<0>(logits.topk(options.top_k)).min();
        logits = logits.masked_fill(logits < kth, -std::numeric_limits<float>::infinity());
      }
      const int64_t next = at::multinomial(at::softmax(logits, 0), 1).item<int64_t>();
      ids.push_back(next);
      out.push_back(static_cast<char>(next));
    }
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("generation failed: ", e.what()));
  }
  return out;
}

}  // namespace trainstep
