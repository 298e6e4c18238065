#include "core/spec.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "common/fnv1a.h"
#include "common/status_macros.h"
#include "core/hang.h"
#include "core/llama_config.h"
#include "core/spec_parse_error.h"
#include "core/spec_text.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/util/json_util.h"

namespace trainstep {
namespace {

namespace pb = ::google::protobuf;

// ---------------------------------------------------------------------------------------
// Rules. Each returns "<path> <rule>, got <value>".

absl::Status Invalid(const std::string& message) { return absl::InvalidArgumentError(message); }

absl::Status IntInRange(absl::string_view path, int64_t value, int64_t lo, int64_t hi) {
  if (value < lo) return Invalid(absl::StrCat(path, " must be ≥ ", lo, ", got ", value));
  if (value > hi) return Invalid(absl::StrCat(path, " must be ≤ ", hi, ", got ", value));
  return absl::OkStatus();
}

absl::Status IntAtLeast(absl::string_view path, int64_t value, int64_t lo) {
  return IntInRange(path, value, lo, std::numeric_limits<int64_t>::max());
}

enum class End { kClosed, kOpen };

// Finite, and within the interval; hi = +inf means no upper bound.
absl::Status DoubleInRange(absl::string_view path, double value, double lo, End lo_end,
                           double hi = std::numeric_limits<double>::infinity(),
                           End hi_end = End::kOpen) {
  if (!std::isfinite(value)) {
    return Invalid(absl::StrCat(path, " must be finite, got ", FormatDouble(value)));
  }
  const bool below = lo_end == End::kClosed ? value < lo : value <= lo;
  const bool above = hi_end == End::kClosed ? value > hi : value >= hi;
  if (!below && !above) return absl::OkStatus();
  std::string rule;
  if (std::isinf(hi)) {
    rule = absl::StrCat(lo_end == End::kClosed ? "≥ " : "> ", FormatDouble(lo));
  } else {
    rule = absl::StrCat("in ", lo_end == End::kClosed ? "[" : "(", FormatDouble(lo), ", ",
                        FormatDouble(hi), hi_end == End::kClosed ? "]" : ")");
  }
  return Invalid(absl::StrCat(path, " must be ", rule, ", got ", FormatDouble(value)));
}

// A list of non-empty strings without duplicates.
absl::Status DistinctNonEmpty(absl::string_view path, const pb::RepeatedPtrField<std::string>& list,
                              absl::string_view element_name = "") {
  std::map<absl::string_view, int> seen;
  for (int i = 0; i < list.size(); ++i) {
    const std::string at = absl::StrCat(path, "[", i, "]", element_name);
    if (list[i].empty()) return Invalid(absl::StrCat(at, " must not be empty, got \"\""));
    auto [it, inserted] = seen.emplace(list[i], i);
    if (!inserted) {
      return Invalid(absl::StrCat(at, " must be unique, got ", Quote(list[i]), " (also at ", path,
                                  "[", it->second, "]", element_name, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status KnownEnum(absl::string_view path, const pb::EnumDescriptor* e, int value) {
  if (e->FindValueByNumber(value) != nullptr) return absl::OkStatus();
  return Invalid(absl::StrCat(path, " must be one of ", EnumChoices(e), ", got ", value));
}

std::string DataKind(const v1::Data& data) {
  switch (data.source_case()) {
    case v1::Data::kText:
      return "data.text";
    case v1::Data::kJsonl:
      return "data.jsonl";
    case v1::Data::kSyntheticRegression:
      return "data.synthetic_regression";
    case v1::Data::kTokens:
      return "data.tokens";
    case v1::Data::SOURCE_NOT_SET:
      break;
  }
  return "no data";
}

// "data.text, data.jsonl or data.tokens": the token-level sources, for messages.
constexpr char kTokenSources[] = "data.text, data.jsonl or data.tokens";

// The largest of a spec's sizes: model widths and feature counts, sequence lengths (a model's
// context included) and batch factors.
constexpr int32_t kMaxSize = 65536;
// As core/llama_config.h allows: real vocabularies reach 256k (Gemma), 152k (Qwen2).
constexpr int32_t kMaxLlamaVocab = 10000000;

// Every default the resolver fills in, in spec.proto's order. README's spec reference lists
// the same values; a default that depends on another field says so where it is applied.
namespace defaults {
constexpr char kName[] = "job";
constexpr int64_t kSeed = 0;
constexpr int32_t kTinyGptLayers = 2;
constexpr int32_t kTinyGptHeads = 2;
constexpr int32_t kTinyGptWidth = 64;
constexpr int32_t kTinyGptContextJsonl = 256;  // jsonl samples carry their own length
constexpr int32_t kVocabSize = 256;            // bytes
constexpr int32_t kMlpHidden = 32;
constexpr int32_t kMlpOutFeatures = 1;
constexpr int32_t kInFeatures = 8;
constexpr int32_t kTextSeqLen = 128;
constexpr int64_t kSyntheticSamples = 1024;
constexpr int32_t kMicroBatchSize = 8;
constexpr int32_t kAccumulationSteps = 1;
constexpr double kSgdLr = 0.01;
constexpr double kSgdMomentum = 0;
constexpr double kSgdWeightDecay = 0;
constexpr double kAdamWLr = 1e-3;
constexpr double kAdamWBeta1 = 0.9;
constexpr double kAdamWBeta2 = 0.999;
constexpr double kAdamWEps = 1e-8;
constexpr double kAdamWWeightDecay = 0.01;
constexpr double kLrScale = 1.0;
constexpr int64_t kWarmupUpdates = 0;
constexpr double kMinLrRatio = 0;
constexpr double kInitScale = 65536.0;
constexpr double kGrowthFactor = 2.0;
constexpr double kBackoffFactor = 0.5;
constexpr int64_t kGrowthInterval = 2000;
constexpr int32_t kHysteresis = 1;
constexpr double kMinScale = 0;
constexpr int64_t kEpochs = 1;  // when neither stop.max_updates nor stop.epochs is set
constexpr int64_t kCheckpointEveryUpdates = 100;
constexpr int32_t kCheckpointKeepLast = 3;
constexpr int32_t kWorkers = 1;
// Three of the coordinator's default 10 s leases: long enough for a restarted worker process to
// come back, short enough that a job does not idle for minutes on a lost machine.
constexpr int64_t kJoinGraceSeconds = 30;
constexpr int64_t kEvalEveryUpdates = 100;
// Long enough that one slow window (a page-cache miss) makes no straggler, short enough to
// see a slow node within a minute.
constexpr int32_t kScoreWindows = kDefaultScoreWindows;
// validate: Megatron-Core's rerun state machine's usual spike test, over a window long enough
// for a stable mean and short enough to follow the loss curve; two transient faults before a
// worker is drained (one may be a cosmic ray, two on one worker are a pattern).
constexpr double kSpikeSigma = 6.0;
constexpr int32_t kSpikeWindow = 50;
constexpr int32_t kMaxSuspect = 2;
}  // namespace defaults

// ---------------------------------------------------------------------------------------
// One function per top-level field, called in the order of spec.proto, each filling its part
// of `out`. Where a rule or a default involves another field, it reads the user's spec `in`
// (what was given) or the part of `out` resolved before it, never a part resolved after.

absl::Status ResolveName(v1::JobSpec& out) {
  if (out.name().empty()) out.set_name(defaults::kName);
  const std::string& name = out.name();
  int characters = 0;
  for (size_t i = 0; i < name.size(); ++i) {
    if (IsControlAt(name, i)) {
      return Invalid(absl::StrCat("name must not contain control characters, got ", Quote(name)));
    }
    if ((static_cast<unsigned char>(name[i]) & 0xC0) != 0x80) ++characters;  // not a UTF-8 tail
  }
  if (characters > 128) {
    return Invalid(absl::StrCat("name must have at most 128 characters, got ", characters));
  }
  return absl::OkStatus();
}

// model.llama: a directory the workers read, or an inline config checked here, so that a bad
// one fails at submission; either way the vocabulary is known once the config is.
absl::Status ResolveLlama(v1::Llama& llama) {
  const bool inline_config = llama.config().fields_size() > 0;
  if (llama.path().empty() == !inline_config) {
    return Invalid(
        "model.llama needs exactly one of path (a directory in Hugging Face layout: config.json "
        "and model.safetensors) and config (config.json's keys, for freshly initialised weights)");
  }
  if (llama.has_vocab_size()) {
    RETURN_IF_ERROR(IntInRange("model.llama.vocab_size", llama.vocab_size(), 2, kMaxLlamaVocab));
  }
  if (!inline_config) return absl::OkStatus();  // the workers read path/config.json
  ASSIGN_OR_RETURN(const LlamaConfig config,
                   ParseLlamaConfig(llama.config(), "model.llama.config", nullptr));
  if (llama.has_vocab_size() && llama.vocab_size() != config.vocab_size) {
    return Invalid(absl::StrCat("model.llama.vocab_size is ", llama.vocab_size(),
                                ", but model.llama.config.vocab_size is ", config.vocab_size));
  }
  llama.set_vocab_size(static_cast<int32_t>(config.vocab_size));
  return absl::OkStatus();
}

absl::Status ResolveModel(const v1::JobSpec& in, v1::JobSpec& out) {
  v1::Model& model = *out.mutable_model();
  const v1::Data& data = in.data();
  const bool token_data = data.has_text() || data.has_jsonl() || data.has_tokens();
  switch (model.kind_case()) {
    case v1::Model::KIND_NOT_SET:
      return Invalid(absl::StrCat("model is required: one of ",
                                  OneofNames(v1::Model::descriptor()->FindOneofByName("kind"))));
    case v1::Model::kTinyGpt:
    case v1::Model::kTorchscript:
    case v1::Model::kLlama:
      if (data.source_case() != v1::Data::SOURCE_NOT_SET && !token_data) {
        const char* kind = model.has_tiny_gpt()      ? "tiny_gpt"
                           : model.has_torchscript() ? "torchscript"
                                                     : "llama";
        return Invalid(
            absl::StrCat("model.", kind, " needs ", kTokenSources, ", got ", DataKind(data)));
      }
      break;
    case v1::Model::kMlp:
      if (data.source_case() != v1::Data::SOURCE_NOT_SET && !data.has_synthetic_regression()) {
        return Invalid(
            absl::StrCat("model.mlp needs data.synthetic_regression, got ", DataKind(data)));
      }
      break;
  }

  if (model.has_tiny_gpt()) {
    v1::TinyGpt& t = *model.mutable_tiny_gpt();
    if (!t.has_n_layer()) t.set_n_layer(defaults::kTinyGptLayers);
    RETURN_IF_ERROR(IntInRange("model.tiny_gpt.n_layer", t.n_layer(), 1, 64));
    if (!t.has_n_head()) t.set_n_head(defaults::kTinyGptHeads);
    RETURN_IF_ERROR(IntInRange("model.tiny_gpt.n_head", t.n_head(), 1, 64));
    if (!t.has_d_model()) t.set_d_model(defaults::kTinyGptWidth);
    RETURN_IF_ERROR(IntInRange("model.tiny_gpt.d_model", t.d_model(), 1, 8192));
    if (t.d_model() % t.n_head() != 0) {
      return Invalid(
          absl::StrCat("model.tiny_gpt.d_model must be divisible by model.tiny_gpt.n_head, got ",
                       t.d_model(), " and ", t.n_head()));
    }
    // Without a context length, ResolveModelFromData takes the resolved data's.
    if (t.has_seq_len()) {
      RETURN_IF_ERROR(IntInRange("model.tiny_gpt.seq_len", t.seq_len(), 2, kMaxSize));
    }
    if (!t.has_vocab_size()) t.set_vocab_size(defaults::kVocabSize);
    RETURN_IF_ERROR(IntInRange("model.tiny_gpt.vocab_size", t.vocab_size(), 2, 1000000));
  } else if (model.has_mlp()) {
    v1::Mlp& m = *model.mutable_mlp();
    const v1::SyntheticRegression& regression = data.synthetic_regression();
    if (m.has_in_features()) {
      RETURN_IF_ERROR(IntInRange("model.mlp.in_features", m.in_features(), 1, kMaxSize));
      if (regression.has_in_features() && regression.in_features() != m.in_features()) {
        return Invalid(absl::StrCat(
            "model.mlp.in_features must equal data.synthetic_regression.in_features, got ",
            m.in_features(), " and ", regression.in_features()));
      }
    }  // else ResolveModelFromData takes the resolved data's
    if (!m.has_hidden()) m.set_hidden(defaults::kMlpHidden);
    RETURN_IF_ERROR(IntInRange("model.mlp.hidden", m.hidden(), 1, kMaxSize));
    if (!m.has_out_features()) m.set_out_features(defaults::kMlpOutFeatures);
    RETURN_IF_ERROR(IntInRange("model.mlp.out_features", m.out_features(), 1, kMaxSize));
  } else if (model.has_llama()) {
    RETURN_IF_ERROR(ResolveLlama(*model.mutable_llama()));
  } else {
    v1::TorchScript& ts = *model.mutable_torchscript();
    if (ts.path().empty()) {
      return Invalid(
          "model.torchscript.path is required: the TorchScript file whose forward(input_ids) "
          "returns logits, got \"\"");
    }
    // The model knows its vocabulary (the worker reads it at load); a value here only asserts it.
    if (ts.has_vocab_size()) {
      RETURN_IF_ERROR(IntInRange("model.torchscript.vocab_size", ts.vocab_size(), 2, 1000000));
    }
  }
  // The blocks it recomputes are the built-in transformers'; a user's module has none we know.
  if (!model.has_activation_checkpointing()) model.set_activation_checkpointing(false);
  if (model.activation_checkpointing() && !model.has_tiny_gpt() && !model.has_llama()) {
    return Invalid(absl::StrCat(
        "model.activation_checkpointing is for the built-in transformers (tiny_gpt, llama), got "
        "model.",
        model.has_mlp() ? "mlp" : "torchscript"));
  }
  return absl::OkStatus();
}

// `path` is "data" or "eval.data"; `model` bounds the samples' length (the user's model for
// the training data, the resolved one for the held-out data).
absl::Status ResolveTokens(const v1::Model& model, absl::string_view path, v1::TokensData& tokens) {
  const std::string at = absl::StrCat(path, ".tokens");
  if (tokens.path().empty()) {
    return Invalid(absl::StrCat(at,
                                ".path is required: a flat file of little-endian token ids "
                                "(nanoGPT's train.bin), got \"\""));
  }
  if (tokens.dtype() == v1::TokensData::DTYPE_UNSPECIFIED) {
    return Invalid(
        absl::StrCat(at, ".dtype is required: ", EnumChoices(v1::TokensData::Dtype_descriptor()),
                     " (the width of the ids in the file; no default, since ids read "
                     "with the wrong width are silently wrong)"));
  }
  RETURN_IF_ERROR(
      KnownEnum(absl::StrCat(at, ".dtype"), v1::TokensData::Dtype_descriptor(), tokens.dtype()));
  const v1::TinyGpt& gpt = model.tiny_gpt();
  const bool model_seq_len = model.has_tiny_gpt() && gpt.has_seq_len();
  if (!tokens.has_seq_len()) {
    // A model with a shorter context gets samples that fit it (a sample is seq_len + 1).
    tokens.set_seq_len(model_seq_len
                           ? std::max(1, std::min(defaults::kTextSeqLen, gpt.seq_len() - 1))
                           : defaults::kTextSeqLen);
  }
  // A sample is seq_len + 1 tokens: it must fit the longest context.
  RETURN_IF_ERROR(IntInRange(absl::StrCat(at, ".seq_len"), tokens.seq_len(), 1, kMaxSize - 1));
  if (model_seq_len && tokens.seq_len() >= gpt.seq_len()) {
    return Invalid(absl::StrCat(
        at, ".seq_len must be < model.tiny_gpt.seq_len (a sample is seq_len + 1 tokens ",
        "and must fit the model's context), got ", tokens.seq_len(), " and ", gpt.seq_len()));
  }
  return absl::OkStatus();
}

// One data source (`path` "data" or "eval.data"); `model` as above.
absl::Status ResolveDataSource(const v1::Model& model, absl::string_view path, v1::Data& data) {
  switch (data.source_case()) {
    case v1::Data::SOURCE_NOT_SET:
      return Invalid(absl::StrCat(path, " is required: one of ",
                                  OneofNames(v1::Data::descriptor()->FindOneofByName("source"))));
    case v1::Data::kText: {
      v1::TextData& text = *data.mutable_text();
      if (text.paths().empty()) {
        return Invalid(
            absl::StrCat(path, ".text.paths must list at least one file or directory, got []"));
      }
      for (int i = 0; i < text.paths_size(); ++i) {
        if (text.paths(i).empty()) {
          return Invalid(absl::StrCat(path, ".text.paths[", i, "] must not be empty, got \"\""));
        }
      }
      const v1::TinyGpt& gpt = model.tiny_gpt();
      const bool model_seq_len = model.has_tiny_gpt() && gpt.has_seq_len();
      if (!text.has_seq_len()) {
        // A model with a shorter context than the default sample gets samples that fit it.
        text.set_seq_len(model_seq_len ? std::min(defaults::kTextSeqLen, gpt.seq_len())
                                       : defaults::kTextSeqLen);
      }
      RETURN_IF_ERROR(IntInRange(absl::StrCat(path, ".text.seq_len"), text.seq_len(), 2, kMaxSize));
      if (model_seq_len && text.seq_len() > gpt.seq_len()) {
        return Invalid(absl::StrCat(
            path,
            ".text.seq_len must be ≤ model.tiny_gpt.seq_len (samples must fit the model's "
            "context), got ",
            text.seq_len(), " and ", gpt.seq_len()));
      }
      break;
    }
    case v1::Data::kJsonl:
      if (data.jsonl().path().empty()) {
        return Invalid(absl::StrCat(path,
                                    ".jsonl.path is required: a file with one {\"input_ids\": "
                                    "[...], \"labels\": [...]} per line, got \"\""));
      }
      break;
    case v1::Data::kSyntheticRegression: {
      v1::SyntheticRegression& r = *data.mutable_synthetic_regression();
      if (!r.has_samples()) r.set_samples(defaults::kSyntheticSamples);
      RETURN_IF_ERROR(IntInRange(absl::StrCat(path, ".synthetic_regression.samples"), r.samples(),
                                 1, 100000000));
      if (!r.has_in_features()) {
        const bool mlp_in = model.has_mlp() && model.mlp().has_in_features();
        r.set_in_features(mlp_in ? model.mlp().in_features() : defaults::kInFeatures);
      }
      RETURN_IF_ERROR(IntInRange(absl::StrCat(path, ".synthetic_regression.in_features"),
                                 r.in_features(), 1, kMaxSize));
      break;
    }
    case v1::Data::kTokens:
      RETURN_IF_ERROR(ResolveTokens(model, path, *data.mutable_tokens()));
      break;
  }
  return absl::OkStatus();
}

absl::Status ResolveData(const v1::JobSpec& in, v1::JobSpec& out) {
  v1::Data& data = *out.mutable_data();
  RETURN_IF_ERROR(ResolveDataSource(in.model(), "data", data));
  if (!data.has_shuffle()) data.set_shuffle(false);
  return absl::OkStatus();
}

// The model's defaults that follow its data, read from the resolved data. Defaults flow one
// way only: the user's model → the data's defaults (ResolveDataSource) → these.
absl::Status ResolveModelFromData(v1::JobSpec& out) {
  v1::Model& model = *out.mutable_model();
  const v1::Data& data = out.data();
  if (model.has_tiny_gpt() && !model.tiny_gpt().has_seq_len()) {
    int32_t context = defaults::kTinyGptContextJsonl;
    if (data.has_text()) {
      context = data.text().seq_len();
    } else if (data.has_tokens()) {
      // A tokens sample is seq_len + 1 tokens.
      context = static_cast<int32_t>(std::min<int64_t>(data.tokens().seq_len() + 1, kMaxSize));
    }
    model.mutable_tiny_gpt()->set_seq_len(context);
  }
  if (model.has_mlp() && !model.mlp().has_in_features()) {
    model.mutable_mlp()->set_in_features(data.synthetic_regression().in_features());
  }
  return absl::OkStatus();
}

absl::Status ResolveBatch(v1::JobSpec& out) {
  v1::Batch& batch = *out.mutable_batch();
  if (!batch.has_micro_batch_size()) batch.set_micro_batch_size(defaults::kMicroBatchSize);
  RETURN_IF_ERROR(IntInRange("batch.micro_batch_size", batch.micro_batch_size(), 1, kMaxSize));
  if (!batch.has_accumulation_steps()) batch.set_accumulation_steps(defaults::kAccumulationSteps);
  RETURN_IF_ERROR(IntInRange("batch.accumulation_steps", batch.accumulation_steps(), 1, kMaxSize));
  if (batch.tail() == v1::Batch::TAIL_UNSPECIFIED) batch.set_tail(v1::Batch::dynamic);
  return KnownEnum("batch.tail", v1::Batch::Tail_descriptor(), batch.tail());
}

absl::Status ResolvePrecision(v1::JobSpec& out) {
  if (out.precision() == v1::JobSpec::PRECISION_UNSPECIFIED) out.set_precision(v1::JobSpec::fp32);
  return KnownEnum("precision", v1::JobSpec::Precision_descriptor(), out.precision());
}

absl::Status ResolveLoss(v1::JobSpec& out) {
  v1::Loss& loss = *out.mutable_loss();
  const bool token_level = IsTokenLevel(out);
  if (loss.normalization() == v1::Loss::NORMALIZATION_UNSPECIFIED) {
    loss.set_normalization(token_level ? v1::Loss::tokens : v1::Loss::samples);
  }
  RETURN_IF_ERROR(
      KnownEnum("loss.normalization", v1::Loss::Normalization_descriptor(), loss.normalization()));
  if (loss.normalization() == v1::Loss::tokens && !token_level) {
    return Invalid(absl::StrCat("loss.normalization tokens needs token data (", kTokenSources,
                                "); synthetic_regression is sample-level: use samples"));
  }
  if (loss.normalization() == v1::Loss::samples && token_level) {
    return Invalid(absl::StrCat(
        "loss.normalization samples needs sample data (data.synthetic_regression); ",
        absl::StripPrefix(DataKind(out.data()), "data."), " is token-level: use tokens"));
  }
  return absl::OkStatus();
}

absl::Status ResolveOptimizer(v1::JobSpec& out) {
  v1::Optimizer& opt = *out.mutable_optimizer();
  if (opt.kind_case() == v1::Optimizer::KIND_NOT_SET) opt.mutable_adamw();
  if (opt.has_sgd()) {
    v1::Sgd& sgd = *opt.mutable_sgd();
    if (!sgd.has_lr()) sgd.set_lr(defaults::kSgdLr);
    RETURN_IF_ERROR(DoubleInRange("optimizer.sgd.lr", sgd.lr(), 0, End::kOpen));
    if (!sgd.has_momentum()) sgd.set_momentum(defaults::kSgdMomentum);
    RETURN_IF_ERROR(
        DoubleInRange("optimizer.sgd.momentum", sgd.momentum(), 0, End::kClosed, 1, End::kOpen));
    if (!sgd.has_weight_decay()) sgd.set_weight_decay(defaults::kSgdWeightDecay);
    RETURN_IF_ERROR(
        DoubleInRange("optimizer.sgd.weight_decay", sgd.weight_decay(), 0, End::kClosed));
  } else {
    v1::AdamW& adam = *opt.mutable_adamw();
    if (!adam.has_lr()) adam.set_lr(defaults::kAdamWLr);
    RETURN_IF_ERROR(DoubleInRange("optimizer.adamw.lr", adam.lr(), 0, End::kOpen));
    if (!adam.has_beta1()) adam.set_beta1(defaults::kAdamWBeta1);
    RETURN_IF_ERROR(
        DoubleInRange("optimizer.adamw.beta1", adam.beta1(), 0, End::kClosed, 1, End::kOpen));
    if (!adam.has_beta2()) adam.set_beta2(defaults::kAdamWBeta2);
    RETURN_IF_ERROR(
        DoubleInRange("optimizer.adamw.beta2", adam.beta2(), 0, End::kClosed, 1, End::kOpen));
    if (!adam.has_eps()) adam.set_eps(defaults::kAdamWEps);
    RETURN_IF_ERROR(DoubleInRange("optimizer.adamw.eps", adam.eps(), 0, End::kOpen));
    if (!adam.has_weight_decay()) adam.set_weight_decay(defaults::kAdamWWeightDecay);
    RETURN_IF_ERROR(
        DoubleInRange("optimizer.adamw.weight_decay", adam.weight_decay(), 0, End::kClosed));
  }

  pb::RepeatedPtrField<std::string> group_prefixes;
  for (int i = 0; i < opt.param_groups_size(); ++i) {
    v1::ParamGroup& group = *opt.mutable_param_groups(i);
    *group_prefixes.Add() = group.prefix();
    if (!group.has_lr_scale()) group.set_lr_scale(defaults::kLrScale);
  }
  RETURN_IF_ERROR(DistinctNonEmpty("optimizer.param_groups", group_prefixes, ".prefix"));
  for (int i = 0; i < opt.param_groups_size(); ++i) {
    RETURN_IF_ERROR(DoubleInRange(absl::StrCat("optimizer.param_groups[", i, "].lr_scale"),
                                  opt.param_groups(i).lr_scale(), 0, End::kClosed));
  }
  RETURN_IF_ERROR(DistinctNonEmpty("optimizer.frozen_prefixes", opt.frozen_prefixes()));
  for (int i = 0; i < opt.frozen_prefixes_size(); ++i) {
    for (int g = 0; g < group_prefixes.size(); ++g) {
      if (opt.frozen_prefixes(i) == group_prefixes[g]) {
        return Invalid(absl::StrCat(
            "optimizer.frozen_prefixes[", i, "] must not also be a param group prefix ",
            "(frozen parameters are in no optimizer), got ", Quote(opt.frozen_prefixes(i)),
            " (also optimizer.param_groups[", g, "].prefix)"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ResolveSchedule(const v1::JobSpec& in, v1::JobSpec& out) {
  v1::Schedule& schedule = *out.mutable_schedule();
  v1::WarmupDecay* decay = nullptr;
  std::string path;
  switch (schedule.kind_case()) {
    case v1::Schedule::KIND_NOT_SET:
      schedule.mutable_constant();
      return absl::OkStatus();
    case v1::Schedule::kConstant:
      return absl::OkStatus();
    case v1::Schedule::kWarmupCosine:
      decay = schedule.mutable_warmup_cosine();
      path = "schedule.warmup_cosine";
      break;
    case v1::Schedule::kWarmupLinear:
      decay = schedule.mutable_warmup_linear();
      path = "schedule.warmup_linear";
      break;
  }
  if (!decay->has_warmup_updates()) decay->set_warmup_updates(defaults::kWarmupUpdates);
  RETURN_IF_ERROR(IntAtLeast(path + ".warmup_updates", decay->warmup_updates(), 0));
  const bool from_stop = !decay->has_total_updates();
  if (from_stop) {
    if (!in.stop().has_max_updates()) {
      return Invalid(
          absl::StrCat(path, ".total_updates is required when stop.max_updates is not set"));
    }
    decay->set_total_updates(in.stop().max_updates());
  }
  // A bad stop.max_updates is reported as such, under stop.
  if (!from_stop || in.stop().max_updates() >= 1) {
    RETURN_IF_ERROR(IntAtLeast(path + ".total_updates", decay->total_updates(), 1));
    if (decay->total_updates() < decay->warmup_updates()) {
      return Invalid(absl::StrCat(
          path, ".total_updates", from_stop ? " (from stop.max_updates)" : "", " must be ≥ ", path,
          ".warmup_updates, got ", decay->total_updates(), " and ", decay->warmup_updates()));
    }
  }
  if (!decay->has_min_lr_ratio()) decay->set_min_lr_ratio(defaults::kMinLrRatio);
  return DoubleInRange(path + ".min_lr_ratio", decay->min_lr_ratio(), 0, End::kClosed, 1,
                       End::kClosed);
}

absl::Status ResolveClip(v1::JobSpec& out) {
  v1::Clip& clip = *out.mutable_clip();
  if (!clip.has_max_grad_norm()) return absl::OkStatus();  // no clipping
  return DoubleInRange("clip.max_grad_norm", clip.max_grad_norm(), 0, End::kOpen);
}

absl::Status ResolveLossScaler(v1::JobSpec& out) {
  v1::LossScaler& s = *out.mutable_loss_scaler();
  if (!s.has_enabled()) s.set_enabled(out.precision() == v1::JobSpec::fp16);
  if (s.enabled() && out.precision() == v1::JobSpec::bf16) {
    return Invalid(
        "loss_scaler.enabled must be false with precision bf16: bf16 has fp32's range and needs "
        "no scaler");
  }
  if (!s.enabled() && out.precision() == v1::JobSpec::fp16) {
    return Invalid(
        "loss_scaler.enabled must be true with precision fp16: fp16 gradients underflow without "
        "a scaler");
  }
  if (!s.has_init_scale()) s.set_init_scale(defaults::kInitScale);
  RETURN_IF_ERROR(DoubleInRange("loss_scaler.init_scale", s.init_scale(), 0, End::kOpen));
  if (!s.has_growth_factor()) s.set_growth_factor(defaults::kGrowthFactor);
  RETURN_IF_ERROR(DoubleInRange("loss_scaler.growth_factor", s.growth_factor(), 1, End::kOpen));
  if (!s.has_backoff_factor()) s.set_backoff_factor(defaults::kBackoffFactor);
  RETURN_IF_ERROR(DoubleInRange("loss_scaler.backoff_factor", s.backoff_factor(), 0, End::kOpen, 1,
                                End::kOpen));
  if (!s.has_growth_interval()) s.set_growth_interval(defaults::kGrowthInterval);
  RETURN_IF_ERROR(IntAtLeast("loss_scaler.growth_interval", s.growth_interval(), 1));
  if (!s.has_hysteresis()) s.set_hysteresis(defaults::kHysteresis);
  RETURN_IF_ERROR(IntAtLeast("loss_scaler.hysteresis", s.hysteresis(), 1));
  if (!s.has_min_scale()) s.set_min_scale(defaults::kMinScale);
  RETURN_IF_ERROR(DoubleInRange("loss_scaler.min_scale", s.min_scale(), 0, End::kClosed));
  if (s.min_scale() > s.init_scale()) {
    return Invalid(absl::StrCat("loss_scaler.min_scale must be ≤ loss_scaler.init_scale, got ",
                                FormatDouble(s.min_scale()), " and ",
                                FormatDouble(s.init_scale())));
  }
  return absl::OkStatus();
}

absl::Status ResolveStop(v1::JobSpec& out) {
  v1::Stop& stop = *out.mutable_stop();
  if (stop.has_max_updates()) {
    RETURN_IF_ERROR(IntAtLeast("stop.max_updates", stop.max_updates(), 1));
  }
  if (stop.has_epochs()) {
    RETURN_IF_ERROR(IntAtLeast("stop.epochs", stop.epochs(), 1));
  }
  // Unset max_updates means "bounded by epochs only"; with neither, one pass.
  if (!stop.has_max_updates() && !stop.has_epochs()) stop.set_epochs(defaults::kEpochs);
  return absl::OkStatus();
}

absl::Status ResolveCheckpoint(v1::JobSpec& out) {
  v1::Checkpoint& c = *out.mutable_checkpoint();
  if (!c.has_every_updates()) c.set_every_updates(defaults::kCheckpointEveryUpdates);
  RETURN_IF_ERROR(IntAtLeast("checkpoint.every_updates", c.every_updates(), 1));
  if (!c.has_keep_last()) c.set_keep_last(defaults::kCheckpointKeepLast);
  return IntAtLeast("checkpoint.keep_last", c.keep_last(), 0);
}

// A spec Duration within [0s, 86400s] (a day at most), or INVALID_ARGUMENT naming `path`.
absl::Status DurationUpToADay(absl::string_view path, const google::protobuf::Duration& d) {
  if (d.seconds() < 0 || d.nanos() < 0 || d.seconds() > 86400 ||
      (d.seconds() == 86400 && d.nanos() > 0)) {
    return Invalid(absl::StrCat(path, " must be between 0s and 86400s, got ", d.seconds(), "s"));
  }
  return absl::OkStatus();
}

absl::Status ResolveWorkers(v1::JobSpec& out) {
  v1::Workers& w = *out.mutable_workers();
  if (!w.has_count()) w.set_count(defaults::kWorkers);
  RETURN_IF_ERROR(IntInRange("workers.count", w.count(), 1, 1024));
  if (!w.has_min()) w.set_min(w.count());
  RETURN_IF_ERROR(IntInRange("workers.min", w.min(), 1, w.count()));
  if (!w.has_join_grace()) w.mutable_join_grace()->set_seconds(defaults::kJoinGraceSeconds);
  // A day at most: a job that waits longer for a worker is better told to shrink.
  return DurationUpToADay("workers.join_grace", w.join_grace());
}

absl::Status ResolveHang(v1::JobSpec& out) {
  v1::Hang& h = *out.mutable_hang();
  if (!h.has_floor()) h.mutable_floor()->set_seconds(kDefaultHangFloorSeconds);
  if (!h.has_cap()) h.mutable_cap()->set_seconds(kDefaultHangCapSeconds);
  if (!h.has_factor()) h.set_factor(kDefaultHangFactor);
  RETURN_IF_ERROR(DurationUpToADay("hang.floor", h.floor()));
  RETURN_IF_ERROR(DurationUpToADay("hang.cap", h.cap()));
  const HangPolicy p = HangPolicyOf(out);
  // Under a second a busy host's scheduling alone would fence healthy ranks.
  if (p.floor < absl::Seconds(1)) {
    return Invalid(
        absl::StrCat("hang.floor must be at least 1s, got ", absl::FormatDuration(p.floor)));
  }
  if (p.cap < p.floor) {
    return Invalid(absl::StrCat("hang.cap (", absl::FormatDuration(p.cap),
                                ") must not be below hang.floor (", absl::FormatDuration(p.floor),
                                ")"));
  }
  return DoubleInRange("hang.factor", h.factor(), 1, End::kClosed, 1000, End::kClosed);
}

absl::Status ResolveStragglers(v1::JobSpec& out) {
  v1::Stragglers& s = *out.mutable_stragglers();
  if (!s.has_score_windows()) s.set_score_windows(defaults::kScoreWindows);
  RETURN_IF_ERROR(IntInRange("stragglers.score_windows", s.score_windows(), 1, 10000));
  if (!s.has_replace_below()) {
    if (s.has_replace_after_windows()) {
      return Invalid(
          "stragglers.replace_after_windows needs stragglers.replace_below (the relative score "
          "a rank must stay below to be replaced)");
    }
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(
      DoubleInRange("stragglers.replace_below", s.replace_below(), 0, End::kOpen, 1, End::kOpen));
  if (!s.has_replace_after_windows()) s.set_replace_after_windows(s.score_windows());
  return IntInRange("stragglers.replace_after_windows", s.replace_after_windows(), 1, 10000);
}

absl::Status ResolveValidate(v1::JobSpec& out) {
  v1::Validate& v = *out.mutable_validate();
  std::map<int, int> seen;
  for (int i = 0; i < v.rerun_on_size(); ++i) {
    const std::string path = absl::StrCat("validate.rerun_on[", i, "]");
    if (v.rerun_on(i) == v1::Validate::TRIGGER_UNSPECIFIED) {
      return Invalid(absl::StrCat(path, " must be one of nonfinite, spike"));
    }
    auto [it, inserted] = seen.emplace(v.rerun_on(i), i);
    if (!inserted) {
      return Invalid(absl::StrCat(path, " must be unique, got ",
                                  v1::Validate::Trigger_Name(v.rerun_on(i)),
                                  " (also at validate.rerun_on[", it->second, "])"));
    }
  }
  if (!v.has_spike_sigma()) v.set_spike_sigma(defaults::kSpikeSigma);
  RETURN_IF_ERROR(DoubleInRange("validate.spike_sigma", v.spike_sigma(), 0, End::kOpen));
  if (!v.has_spike_window()) v.set_spike_window(defaults::kSpikeWindow);
  RETURN_IF_ERROR(IntInRange("validate.spike_window", v.spike_window(), 2, 100000));
  if (!v.has_max_suspect()) v.set_max_suspect(defaults::kMaxSuspect);
  RETURN_IF_ERROR(IntInRange("validate.max_suspect", v.max_suspect(), 1, 1000));
  if (!v.has_skip_spikes()) v.set_skip_spikes(false);
  // A re-run tells a fault from the data only if a healthy rank reproduces its first run bit
  // for bit: the built-in models promise that (worker/README, "Finding the faulty rank"); a
  // TorchScript model's ops are the user's, and may be nondeterministic.
  if (!v.rerun_on().empty() && out.model().has_torchscript()) {
    return Invalid(
        "validate.rerun_on needs a built-in model (mlp, tiny_gpt): a TorchScript model's "
        "operations may not reproduce bit for bit, and a re-run could not tell a fault from them");
  }
  return absl::OkStatus();
}

// After the model and the data: the held-out data must suit the resolved model as the
// training data does, and be of the same level (token or sample), or the losses differ.
absl::Status ResolveEval(v1::JobSpec& out) {
  if (!out.has_eval()) return absl::OkStatus();
  v1::Eval& eval = *out.mutable_eval();
  v1::Data& data = *eval.mutable_data();
  RETURN_IF_ERROR(ResolveDataSource(out.model(), "eval.data", data));
  const bool token_level = data.has_text() || data.has_jsonl() || data.has_tokens();
  if (token_level != IsTokenLevel(out)) {
    return Invalid(absl::StrCat(
        "eval.data must be ", IsTokenLevel(out) ? kTokenSources : "data.synthetic_regression",
        " like data (", DataKind(out.data()), "), got ", absl::StrCat("eval.", DataKind(data))));
  }
  if (data.has_synthetic_regression() &&
      data.synthetic_regression().in_features() != out.model().mlp().in_features()) {
    return Invalid(absl::StrCat(
        "eval.data.synthetic_regression.in_features must equal model.mlp.in_features, got ",
        data.synthetic_regression().in_features(), " and ", out.model().mlp().in_features()));
  }
  if (data.has_shuffle() && data.shuffle()) {
    return Invalid(
        "eval.data.shuffle must be false (evaluation reads every sample once), got true");
  }
  data.set_shuffle(false);
  if (!eval.has_every_updates()) eval.set_every_updates(defaults::kEvalEveryUpdates);
  RETURN_IF_ERROR(IntInRange("eval.every_updates", eval.every_updates(), 1, int64_t{1} << 40));
  if (eval.has_max_batches()) {
    RETURN_IF_ERROR(IntInRange("eval.max_batches", eval.max_batches(), 1, int64_t{1} << 40));
  }
  return absl::OkStatus();
}

// -0 and 0 mean the same in every spec field, but protobuf's JSON parser reads the "-0" it
// prints for -0.0 as +0: one value for both keeps parse → print → parse the identity, and
// the spec's hash one hash per meaning.
void ZeroNegativeZeros(pb::Message& message) {
  const pb::Reflection& r = *message.GetReflection();
  std::vector<const pb::FieldDescriptor*> fields;
  r.ListFields(message, &fields);
  for (const pb::FieldDescriptor* f : fields) {
    const int n = f->is_repeated() ? r.FieldSize(message, f) : 1;
    for (int i = 0; i < n; ++i) {
      switch (f->cpp_type()) {
        case pb::FieldDescriptor::CPPTYPE_DOUBLE:
          if (f->is_repeated() ? r.GetRepeatedDouble(message, f, i) == 0.0
                               : r.GetDouble(message, f) == 0.0) {
            f->is_repeated() ? r.SetRepeatedDouble(&message, f, i, 0.0)
                             : r.SetDouble(&message, f, 0.0);
          }
          break;
        case pb::FieldDescriptor::CPPTYPE_FLOAT:
          if (f->is_repeated() ? r.GetRepeatedFloat(message, f, i) == 0.0f
                               : r.GetFloat(message, f) == 0.0f) {
            f->is_repeated() ? r.SetRepeatedFloat(&message, f, i, 0.0f)
                             : r.SetFloat(&message, f, 0.0f);
          }
          break;
        case pb::FieldDescriptor::CPPTYPE_MESSAGE:
          ZeroNegativeZeros(f->is_repeated() ? *r.MutableRepeatedMessage(&message, f, i)
                                             : *r.MutableMessage(&message, f));
          break;
        default:
          break;
      }
    }
  }
}

}  // namespace

absl::StatusOr<v1::JobSpec> ParseJobSpecJson(std::string_view input) {
  // Debian's Abseil has its own string_view; convert once, here.
  const absl::string_view json =
      absl::StripPrefix(absl::string_view(input.data(), input.size()),
                        "\xEF\xBB\xBF");  // a byte-order mark some editors write
  v1::JobSpec spec;
  pb::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  const auto status =
      pb::util::JsonStringToMessage(pb::StringPiece(json.data(), json.size()), &spec, options);
  if (!status.ok()) {
    const auto message = status.message();
    return RewriteParseError(json, absl::string_view(message.data(), message.size()));
  }
  ZeroNegativeZeros(spec);
  return spec;
}

absl::StatusOr<v1::JobSpec> ResolveJobSpec(const v1::JobSpec& spec) {
  v1::JobSpec out = spec;
  ZeroNegativeZeros(out);  // a spec may come as a message, not only through the parser
  // The order of the fields in spec.proto, so the first error is always the same one.
  RETURN_IF_ERROR(ResolveName(out));
  if (!out.has_seed()) out.set_seed(defaults::kSeed);
  RETURN_IF_ERROR(ResolveModel(spec, out));
  RETURN_IF_ERROR(ResolveData(spec, out));
  RETURN_IF_ERROR(ResolveModelFromData(out));
  RETURN_IF_ERROR(ResolveBatch(out));
  RETURN_IF_ERROR(ResolvePrecision(out));
  RETURN_IF_ERROR(ResolveLoss(out));
  RETURN_IF_ERROR(ResolveOptimizer(out));
  RETURN_IF_ERROR(ResolveSchedule(spec, out));
  RETURN_IF_ERROR(ResolveClip(out));
  RETURN_IF_ERROR(ResolveLossScaler(out));
  RETURN_IF_ERROR(ResolveStop(out));
  RETURN_IF_ERROR(ResolveCheckpoint(out));
  RETURN_IF_ERROR(ResolveWorkers(out));
  RETURN_IF_ERROR(ResolveStragglers(out));
  RETURN_IF_ERROR(ResolveValidate(out));
  RETURN_IF_ERROR(ResolveEval(out));
  RETURN_IF_ERROR(ResolveHang(out));
  return out;
}

absl::StatusOr<v1::JobSpec> ParseAndResolveJobSpec(std::string_view json) {
  ASSIGN_OR_RETURN(v1::JobSpec spec, ParseJobSpecJson(json));
  return ResolveJobSpec(spec);
}

std::string JobSpecToJson(const v1::JobSpec& spec, bool pretty) {
  pb::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  options.add_whitespace = pretty;
  std::string json;
  // Printing a JobSpec cannot fail: it has no Any fields that would need a type resolver.
  (void)pb::util::MessageToJsonString(spec, &json, options);
  return json;
}

std::string JobSpecHash(const v1::JobSpec& resolved) {
  std::string bytes;
  {
    pb::io::StringOutputStream stream(&bytes);
    pb::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    resolved.SerializeToCodedStream(&coded);
  }
  return absl::StrFormat("%016x", Fnv1a64(bytes));
}

const v1::LossScaler& DefaultLossScaler() {
  static const v1::LossScaler* const scaler = [] {
    auto* s = new v1::LossScaler;
    s->set_init_scale(defaults::kInitScale);
    s->set_growth_factor(defaults::kGrowthFactor);
    s->set_backoff_factor(defaults::kBackoffFactor);
    s->set_growth_interval(defaults::kGrowthInterval);
    s->set_hysteresis(defaults::kHysteresis);
    s->set_min_scale(defaults::kMinScale);
    return s;
  }();
  return *scaler;
}

int64_t GlobalBatchSamples(const v1::JobSpec& resolved) {
  return int64_t{resolved.batch().micro_batch_size()} * resolved.batch().accumulation_steps() *
         resolved.workers().count();
}

int64_t JobTotalWindows(const v1::JobSpec& resolved, int64_t windows_per_epoch) {
  int64_t total;
  if (__builtin_mul_overflow(windows_per_epoch, resolved.stop().epochs(), &total)) {
    return std::numeric_limits<int64_t>::max();
  }
  return total;
}

bool IsTokenLevel(const v1::JobSpec& resolved) {
  return resolved.data().has_text() || resolved.data().has_jsonl() || resolved.data().has_tokens();
}

int64_t ModelVocabSize(const v1::JobSpec& resolved) {
  const v1::Model& m = resolved.model();
  // A spec resolved before the field existed (journaled by an older coordinator) means bytes.
  if (m.has_tiny_gpt()) {
    return m.tiny_gpt().has_vocab_size() ? m.tiny_gpt().vocab_size() : defaults::kVocabSize;
  }
  // Unknown (0) until the worker has loaded the model and recorded its vocabulary here.
  if (m.has_torchscript()) return m.torchscript().vocab_size();
  if (m.has_llama()) return m.llama().vocab_size();
  return 0;
}

std::string ModelVocabSource(const v1::JobSpec& resolved) {
  if (resolved.model().has_tiny_gpt()) return "model.tiny_gpt.vocab_size";
  if (resolved.model().has_torchscript()) {
    return absl::StrCat("the model ", resolved.model().torchscript().path(), "'s vocab_size");
  }
  if (resolved.model().has_llama()) {
    const v1::Llama& llama = resolved.model().llama();
    return llama.path().empty() ? "model.llama.config.vocab_size"
                                : absl::StrCat(llama.path(), "/config.json's vocab_size");
  }
  return "";
}

}  // namespace trainstep
