#include "core/spec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/util/message_differencer.h"

namespace trainstep {
namespace {

using ::google::protobuf::util::MessageDifferencer;
using ::testing::HasSubstr;

constexpr char kMinimal[] =
    R"({"model":{"tiny_gpt":{}},"data":{"text":{"paths":["/usr/share/common-licenses"]}}})";

// The example in the product brief.
constexpr char kBriefExample[] = R"({"name":"demo","seed":1,
  "model":{"tiny_gpt":{"n_layer":2,"n_head":2,"d_model":64,"seq_len":64}},
  "data":{"text":{"paths":["/usr/share/common-licenses"],"seq_len":64},"shuffle":true},
  "batch":{"micro_batch_size":4,"accumulation_steps":4,"tail":"dynamic"},
  "precision":"bf16","loss":{"normalization":"tokens"},
  "optimizer":{"adamw":{"lr":0.001,"beta1":0.9,"beta2":0.95,"eps":1e-8,"weight_decay":0.1},
               "param_groups":[{"prefix":"blocks.","lr_scale":1.0}],"frozen_prefixes":[]},
  "schedule":{"warmup_cosine":{"warmup_updates":10,"total_updates":200,"min_lr_ratio":0.1}},
  "clip":{"max_grad_norm":1.0},"loss_scaler":{"enabled":false},
  "stop":{"max_updates":200,"epochs":3},
  "checkpoint":{"dir":"/tmp/x","every_updates":50,"keep_last":2},
  "workers":{"count":2}})";

// Every field of every message given explicitly (the other oneof members are below).
constexpr char kFull[] = R"({
  "name": "full", "seed": "18446744073709551615",
  "model": {"torchscript": {"path": "/models/lm.pt", "vocab_size": 512},
            "activation_checkpointing": false},
  "data": {"jsonl": {"path": "/data/train.jsonl"}, "shuffle": false},
  "batch": {"micro_batch_size": 16, "accumulation_steps": 8, "tail": "drop"},
  "precision": "fp16",
  "loss": {"normalization": "microbatch_mean"},
  "optimizer": {"sgd": {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.0001},
                "param_groups": [{"prefix": "head.", "lr_scale": 0.5}, {"prefix": "embed."}],
                "frozen_prefixes": ["frozen.", "pos."]},
  "schedule": {"warmup_linear": {"warmup_updates": 5, "total_updates": 50, "min_lr_ratio": 0.0}},
  "clip": {"max_grad_norm": 0.5},
  "loss_scaler": {"enabled": true, "init_scale": 1024, "growth_factor": 4, "backoff_factor": 0.25,
                  "growth_interval": 10, "hysteresis": 2, "min_scale": 1},
  "stop": {"max_updates": 50, "epochs": 2},
  "checkpoint": {"dir": "/ckpt", "every_updates": 10, "keep_last": 0},
  "workers": {"count": 1024, "min": 3, "join_grace": "1.500s"},
  "stragglers": {"score_windows": 7, "replace_below": 0.5, "replace_after_windows": 3},
  "validate": {"rerun_on": [], "spike_sigma": 4, "spike_window": 20,
               "max_suspect": 3, "skip_spikes": true},
  "hang": {"floor": "2s", "cap": "90s", "factor": 20}
})";

// The smallest specs of the other model/data pairs.
constexpr char kRegression[] = R"({"model":{"mlp":{}},"data":{"synthetic_regression":{}}})";
constexpr char kTorchScriptText[] =
    R"({"model":{"torchscript":{"path":"/m.pt"}},"data":{"text":{"paths":["/c"]}}})";

v1::JobSpec Parse(std::string_view json) {
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecJson(json);
  if (!spec.ok()) {
    ADD_FAILURE() << spec.status() << "\n" << json;
    return {};
  }
  return *spec;
}

v1::JobSpec Resolve(std::string_view json) {
  absl::StatusOr<v1::JobSpec> spec = ParseAndResolveJobSpec(json);
  if (!spec.ok()) {
    ADD_FAILURE() << spec.status() << "\n" << json;
    return {};
  }
  return *spec;
}

// The message of the error, or "OK".
std::string ErrorOf(std::string_view json) {
  absl::StatusOr<v1::JobSpec> spec = ParseAndResolveJobSpec(json);
  if (spec.ok()) return "OK";
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << spec.status();
  return std::string(spec.status().message());
}

// A valid tiny_gpt + text spec with `extra` top-level members appended.
std::string Text(absl::string_view extra = "") {
  return absl::StrCat(R"({"model":{"tiny_gpt":{}},"data":{"text":{"paths":["/c"]}})",
                      extra.empty() ? "" : ",", extra, "}");
}

// A valid mlp + synthetic_regression spec with `extra` top-level members appended.
std::string Regression(absl::string_view extra = "") {
  return absl::StrCat(R"({"model":{"mlp":{}},"data":{"synthetic_regression":{}})",
                      extra.empty() ? "" : ",", extra, "}");
}

// Every field with presence is set in every present sub-message, and no enum is
// *_UNSPECIFIED, except where "unset" carries a meaning.
void ExpectFullyResolved(const google::protobuf::Message& m, const std::string& path = "") {
  namespace pb = ::google::protobuf;
  const pb::Descriptor* d = m.GetDescriptor();
  const pb::Reflection* r = m.GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const pb::FieldDescriptor* f = d->field(i);
    const std::string at = path.empty() ? f->name() : absl::StrCat(path, ".", f->name());
    if (f->is_repeated()) continue;
    if (f->real_containing_oneof() != nullptr) {
      if (r->HasField(m, f)) ExpectFullyResolved(r->GetMessage(m, f), at);
      continue;
    }
    if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE) {
      if (at == "eval" && !r->HasField(m, f)) continue;                // absent: no evaluation
      if (at == "model.llama.config" && !r->HasField(m, f)) continue;  // model.llama.path
      EXPECT_TRUE(r->HasField(m, f)) << at << " is missing";
      ExpectFullyResolved(r->GetMessage(m, f), at);
    } else if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_ENUM) {
      EXPECT_NE(r->GetEnumValue(m, f), 0) << at << " is unspecified";
    } else if (f->has_presence() && at != "clip.max_grad_norm" && at != "stop.max_updates" &&
               at != "stop.epochs" && at != "eval.max_batches" &&
               at != "model.torchscript.vocab_size" &&  // the model's own, read at load
               at != "model.llama.vocab_size" &&        // path: read by the worker
               // Unset: no replacement policy (and its streak length only with it).
               at != "stragglers.replace_below" && at != "stragglers.replace_after_windows") {
      EXPECT_TRUE(r->HasField(m, f)) << at << " has no default filled in";
    }
  }
  if (path.empty()) {
    // Some oneof member of each oneof is chosen.
    const auto& spec = static_cast<const v1::JobSpec&>(m);
    EXPECT_NE(spec.model().kind_case(), v1::Model::KIND_NOT_SET);
    EXPECT_NE(spec.data().source_case(), v1::Data::SOURCE_NOT_SET);
    EXPECT_NE(spec.optimizer().kind_case(), v1::Optimizer::KIND_NOT_SET);
    EXPECT_NE(spec.schedule().kind_case(), v1::Schedule::KIND_NOT_SET);
    EXPECT_TRUE(spec.stop().has_max_updates() || spec.stop().has_epochs());
  }
}

// ---------------------------------------------------------------------------------------
// Valid specs.

// A user who writes out every field gets exactly what they wrote.
TEST(SpecTest, FullSpecParsesAndResolvesUnchanged) {
  const v1::JobSpec parsed = Parse(kFull);
  EXPECT_EQ(parsed.seed(), 18446744073709551615ULL);
  EXPECT_EQ(parsed.model().torchscript().vocab_size(), 512);
  EXPECT_EQ(parsed.batch().tail(), v1::Batch::drop);
  EXPECT_EQ(parsed.precision(), v1::JobSpec::fp16);
  EXPECT_EQ(parsed.loss().normalization(), v1::Loss::microbatch_mean);
  EXPECT_EQ(parsed.optimizer().param_groups_size(), 2);
  EXPECT_EQ(parsed.loss_scaler().hysteresis(), 2);
  EXPECT_EQ(parsed.checkpoint().keep_last(), 0);

  const v1::JobSpec resolved = Resolve(kFull);
  ExpectFullyResolved(resolved);
  // Only the one default not written out (the second group's lr_scale) differs.
  v1::JobSpec expected = parsed;
  expected.mutable_optimizer()->mutable_param_groups(1)->set_lr_scale(1.0);
  EXPECT_TRUE(MessageDifferencer::Equals(resolved, expected)) << resolved.DebugString();
}

// Catches: a replacement policy that drains after one slow window (or never) because its
// streak length was left at 0 instead of following the smoothing it reads.
TEST(SpecTest, ReplaceAfterWindowsFollowsScoreWindows) {
  const v1::JobSpec s = Resolve(Text(R"("stragglers":{"score_windows":12,"replace_below":0.4})"));
  EXPECT_EQ(s.stragglers().replace_below(), 0.4);
  EXPECT_EQ(s.stragglers().replace_after_windows(), 12);
}

// A user who writes only model and data gets every documented default.
TEST(SpecTest, MinimalSpecGetsEveryDefault) {
  const v1::JobSpec s = Resolve(kMinimal);
  ExpectFullyResolved(s);
  EXPECT_EQ(s.name(), "job");
  EXPECT_TRUE(s.has_seed());
  EXPECT_EQ(s.seed(), 0u);
  ASSERT_TRUE(s.model().has_tiny_gpt());
  EXPECT_EQ(s.model().tiny_gpt().n_layer(), 2);
  EXPECT_EQ(s.model().tiny_gpt().n_head(), 2);
  EXPECT_EQ(s.model().tiny_gpt().d_model(), 64);
  EXPECT_EQ(s.model().tiny_gpt().seq_len(), 128);  // = data.text.seq_len
  ASSERT_TRUE(s.data().has_text());
  EXPECT_THAT(s.data().text().paths(), ::testing::ElementsAre("/usr/share/common-licenses"));
  EXPECT_EQ(s.data().text().seq_len(), 128);
  EXPECT_TRUE(s.data().has_shuffle());
  EXPECT_FALSE(s.data().shuffle());
  EXPECT_EQ(s.batch().micro_batch_size(), 8);
  EXPECT_EQ(s.batch().accumulation_steps(), 1);
  EXPECT_EQ(s.batch().tail(), v1::Batch::dynamic);
  EXPECT_EQ(s.precision(), v1::JobSpec::fp32);
  EXPECT_EQ(s.loss().normalization(), v1::Loss::tokens);
  ASSERT_TRUE(s.optimizer().has_adamw());
  EXPECT_EQ(s.optimizer().adamw().lr(), 1e-3);
  EXPECT_EQ(s.optimizer().adamw().beta1(), 0.9);
  EXPECT_EQ(s.optimizer().adamw().beta2(), 0.999);
  EXPECT_EQ(s.optimizer().adamw().eps(), 1e-8);
  EXPECT_EQ(s.optimizer().adamw().weight_decay(), 0.01);
  EXPECT_TRUE(s.optimizer().param_groups().empty());
  EXPECT_TRUE(s.optimizer().frozen_prefixes().empty());
  EXPECT_TRUE(s.schedule().has_constant());
  EXPECT_TRUE(s.has_clip());
  EXPECT_FALSE(s.clip().has_max_grad_norm());  // no clipping
  EXPECT_FALSE(s.loss_scaler().enabled());     // fp32
  EXPECT_EQ(s.loss_scaler().init_scale(), 65536.0);
  EXPECT_EQ(s.loss_scaler().growth_factor(), 2.0);
  EXPECT_EQ(s.loss_scaler().backoff_factor(), 0.5);
  EXPECT_EQ(s.loss_scaler().growth_interval(), 2000);
  EXPECT_EQ(s.loss_scaler().hysteresis(), 1);
  EXPECT_EQ(s.loss_scaler().min_scale(), 0.0);
  EXPECT_FALSE(s.stop().has_max_updates());
  EXPECT_EQ(s.stop().epochs(), 1);
  EXPECT_EQ(s.checkpoint().dir(), "");  // no checkpoints
  EXPECT_EQ(s.checkpoint().every_updates(), 100);
  EXPECT_EQ(s.checkpoint().keep_last(), 3);
  EXPECT_EQ(s.workers().count(), 1);
  EXPECT_EQ(s.workers().min(), 1);  // min follows count: no elasticity unless asked
  EXPECT_EQ(s.workers().join_grace().seconds(), 30);
  EXPECT_EQ(s.stragglers().score_windows(), 20);
  EXPECT_FALSE(s.stragglers().has_replace_below());  // never replaced unless asked
  EXPECT_FALSE(s.stragglers().has_replace_after_windows());
  EXPECT_TRUE(s.validate().rerun_on().empty());  // no re-runs unless asked
  EXPECT_EQ(s.validate().spike_sigma(), 6.0);
  EXPECT_EQ(s.validate().spike_window(), 50);
  EXPECT_EQ(s.validate().max_suspect(), 2);
  EXPECT_FALSE(s.validate().skip_spikes());
  EXPECT_TRUE(IsTokenLevel(s));
  EXPECT_EQ(GlobalBatchSamples(s), 8);
}

// The brief's own example must be accepted as written.
TEST(SpecTest, BriefExampleResolves) {
  const v1::JobSpec s = Resolve(kBriefExample);
  ExpectFullyResolved(s);
  EXPECT_EQ(s.name(), "demo");
  EXPECT_EQ(s.model().tiny_gpt().seq_len(), 64);
  EXPECT_EQ(s.data().text().seq_len(), 64);
  EXPECT_TRUE(s.data().shuffle());
  EXPECT_EQ(s.precision(), v1::JobSpec::bf16);
  EXPECT_EQ(s.optimizer().adamw().beta2(), 0.95);
  EXPECT_EQ(s.optimizer().param_groups(0).prefix(), "blocks.");
  EXPECT_EQ(s.schedule().warmup_cosine().total_updates(), 200);
  EXPECT_EQ(s.schedule().warmup_cosine().min_lr_ratio(), 0.1);
  EXPECT_EQ(s.clip().max_grad_norm(), 1.0);
  EXPECT_FALSE(s.loss_scaler().enabled());
  EXPECT_EQ(s.loss_scaler().init_scale(), 65536.0);  // filled even when disabled
  EXPECT_EQ(s.stop().max_updates(), 200);
  EXPECT_EQ(s.stop().epochs(), 3);
  EXPECT_EQ(s.workers().count(), 2);
  EXPECT_EQ(GlobalBatchSamples(s), 4 * 4 * 2);
}

// A regression user gets sample-level defaults, and mlp.in_features follows the data.
TEST(SpecTest, RegressionDefaults) {
  const v1::JobSpec s = Resolve(kRegression);
  ExpectFullyResolved(s);
  EXPECT_EQ(s.data().synthetic_regression().samples(), 1024);
  EXPECT_EQ(s.data().synthetic_regression().in_features(), 8);
  EXPECT_EQ(s.model().mlp().in_features(), 8);
  EXPECT_EQ(s.model().mlp().hidden(), 32);
  EXPECT_EQ(s.model().mlp().out_features(), 1);
  EXPECT_EQ(s.loss().normalization(), v1::Loss::samples);
  EXPECT_FALSE(IsTokenLevel(s));

  // Either side's in_features is the other's default, so giving it once is enough.
  const v1::JobSpec from_data =
      Resolve(R"({"model":{"mlp":{}},"data":{"synthetic_regression":{"in_features":5}}})");
  EXPECT_EQ(from_data.model().mlp().in_features(), 5);
  const v1::JobSpec from_model =
      Resolve(R"({"model":{"mlp":{"in_features":6}},"data":{"synthetic_regression":{}}})");
  EXPECT_EQ(from_model.data().synthetic_regression().in_features(), 6);
}

// A TorchScript user on text or JSONL gets token-level defaults, and no guessed vocabulary.
// Catches a default model.torchscript.vocab_size (256) that fails any other model at its
// first forward: the worker takes the model's own at load.
TEST(SpecTest, TorchScriptDefaults) {
  const v1::JobSpec s = Resolve(kTorchScriptText);
  ExpectFullyResolved(s);
  EXPECT_FALSE(s.model().torchscript().has_vocab_size());
  EXPECT_EQ(ModelVocabSize(s), 0);  // unknown until the model is loaded
  EXPECT_EQ(s.loss().normalization(), v1::Loss::tokens);
  const v1::JobSpec j =
      Resolve(R"({"model":{"torchscript":{"path":"/m.pt"}},"data":{"jsonl":{"path":"/d"}}})");
  ExpectFullyResolved(j);
  EXPECT_EQ(j.loss().normalization(), v1::Loss::tokens);
  EXPECT_TRUE(IsTokenLevel(j));
}

// model.llama: a directory the workers read (vocabulary unknown until then), or an inline
// config checked at submission. Catches a bad inline config accepted and failing every worker
// instead of the submission, and a spec naming both or neither.
TEST(SpecTest, LlamaPathOrInlineConfig) {
  const v1::JobSpec path =
      Resolve(R"({"model":{"llama":{"path":"/models/smol"}},"data":{"jsonl":{"path":"/d"}}})");
  ExpectFullyResolved(path);
  EXPECT_EQ(ModelVocabSize(path), 0);
  EXPECT_EQ(ModelVocabSource(path), "/models/smol/config.json's vocab_size");
  EXPECT_TRUE(IsTokenLevel(path));

  constexpr char kInline[] =
      R"({"model":{"llama":{"config":{"hidden_size":64,"intermediate_size":128,)"
      R"("num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,)"
      R"("vocab_size":300%s}}},"data":{"jsonl":{"path":"/d"}}})";
  const v1::JobSpec fresh = Resolve(absl::StrFormat(kInline, ""));
  EXPECT_EQ(fresh.model().llama().vocab_size(), 300);
  EXPECT_EQ(ModelVocabSize(fresh), 300);
  EXPECT_EQ(ModelVocabSource(fresh), "model.llama.config.vocab_size");

  EXPECT_EQ(ErrorOf(absl::StrFormat(kInline, R"(,"hidden_act":"gelu")"))
                .rfind("model.llama.config: hidden_act", 0),
            0u)
      << ErrorOf(absl::StrFormat(kInline, R"(,"hidden_act":"gelu")"));
  EXPECT_THAT(ErrorOf(R"({"model":{"llama":{"config":{"hidden_size":"64"}}},)"
                      R"("data":{"jsonl":{"path":"/d"}}})"),
              HasSubstr("hidden_size must be an integer"));
  EXPECT_THAT(ErrorOf(R"({"model":{"llama":{}},"data":{"jsonl":{"path":"/d"}}})"),
              HasSubstr("model.llama needs exactly one of path"));
  EXPECT_THAT(ErrorOf(absl::StrFormat(kInline, "")
                          .replace(std::string_view(R"({"model":{"llama":{)").size(), 0,
                                   R"("path":"/m",)")),
              HasSubstr("model.llama needs exactly one of path"));
  EXPECT_THAT(ErrorOf(R"({"model":{"llama":{"path":"/m"}},"data":{"synthetic_regression":{}}})"),
              HasSubstr("model.llama needs data.text, data.jsonl or data.tokens"));
  EXPECT_THAT(ErrorOf(R"({"model":{"llama":{"path":"/m","vocab_size":1}},)"
                      R"("data":{"jsonl":{"path":"/d"}}})"),
              HasSubstr("model.llama.vocab_size"));
}

// Catches activation checkpointing accepted for a model that has no blocks to recompute (it
// would silently do nothing), or model.init_from lost in resolution.
TEST(SpecTest, ActivationCheckpointingAndInitFrom) {
  const v1::JobSpec plain =
      Resolve(R"({"model":{"llama":{"path":"/m"}},"data":{"jsonl":{"path":"/d"}}})");
  EXPECT_TRUE(plain.model().has_activation_checkpointing());
  EXPECT_FALSE(plain.model().activation_checkpointing());
  const v1::JobSpec both =
      Resolve(R"({"model":{"llama":{"path":"/m"},"activation_checkpointing":true,)"
              R"("init_from":"/ckpt/ckpt-4"},"data":{"jsonl":{"path":"/d"}}})");
  EXPECT_TRUE(both.model().activation_checkpointing());
  EXPECT_EQ(both.model().init_from(), "/ckpt/ckpt-4");
  EXPECT_EQ(ErrorOf(R"({"model":{"tiny_gpt":{},"activation_checkpointing":true},)"
                    R"("data":{"text":{"paths":["/c"]}}})"),
            "OK");
  EXPECT_THAT(ErrorOf(R"({"model":{"mlp":{},"activation_checkpointing":true},)"
                      R"("data":{"synthetic_regression":{}}})"),
              HasSubstr("model.activation_checkpointing is for the built-in transformers "
                        "(tiny_gpt, llama), got model.mlp"));
}

// The tiny_gpt context and the text sample length follow each other when only one is given.
TEST(SpecTest, SeqLenDefaults) {
  // data.text.seq_len given: the model's context is that long.
  const v1::JobSpec from_data =
      Resolve(R"({"model":{"tiny_gpt":{}},"data":{"text":{"paths":["/c"],"seq_len":32}}})");
  EXPECT_EQ(from_data.model().tiny_gpt().seq_len(), 32);
  // A model context shorter than the default sample: samples shrink to fit it.
  const v1::JobSpec short_context =
      Resolve(R"({"model":{"tiny_gpt":{"seq_len":64}},"data":{"text":{"paths":["/c"]}}})");
  EXPECT_EQ(short_context.data().text().seq_len(), 64);
  // A longer model context keeps the default sample length.
  const v1::JobSpec long_context =
      Resolve(R"({"model":{"tiny_gpt":{"seq_len":512}},"data":{"text":{"paths":["/c"]}}})");
  EXPECT_EQ(long_context.data().text().seq_len(), 128);
  // JSONL has no sample length: the model context defaults to 256.
  const v1::JobSpec jsonl = Resolve(R"({"model":{"tiny_gpt":{}},"data":{"jsonl":{"path":"/d"}}})");
  EXPECT_EQ(jsonl.model().tiny_gpt().seq_len(), 256);
}

// A token file: the sample length and the tiny_gpt context follow each other (a sample is
// seq_len + 1 tokens), the vocabulary defaults to bytes and is what the model is built with.
TEST(SpecTest, TokensDefaults) {
  constexpr char kTokens[] =
      R"({"model":{"tiny_gpt":{}},"data":{"tokens":{"path":"/t.bin","dtype":"uint16"}}})";
  const v1::JobSpec s = Resolve(kTokens);
  ExpectFullyResolved(s);
  EXPECT_EQ(s.data().tokens().path(), "/t.bin");
  EXPECT_EQ(s.data().tokens().dtype(), v1::TokensData::uint16);
  EXPECT_EQ(s.data().tokens().seq_len(), 128);
  EXPECT_EQ(s.model().tiny_gpt().seq_len(), 129);  // seq_len + 1 tokens a sample
  EXPECT_EQ(s.model().tiny_gpt().vocab_size(), 256);
  EXPECT_EQ(ModelVocabSize(s), 256);
  EXPECT_EQ(s.loss().normalization(), v1::Loss::tokens);
  EXPECT_TRUE(IsTokenLevel(s));
  EXPECT_TRUE(MessageDifferencer::Equals(*ResolveJobSpec(s), s));  // idempotent

  const v1::JobSpec from_data =
      Resolve(R"({"model":{"tiny_gpt":{"vocab_size":50304}},)"
              R"("data":{"tokens":{"path":"/t.bin","dtype":"uint32","seq_len":64}}})");
  EXPECT_EQ(from_data.model().tiny_gpt().seq_len(), 65);
  EXPECT_EQ(ModelVocabSize(from_data), 50304);
  // A model context shorter than the default sample: samples shrink to fit it.
  const v1::JobSpec short_context = Resolve(
      R"({"model":{"tiny_gpt":{"seq_len":64}},"data":{"tokens":{"path":"/t","dtype":"uint16"}}})");
  EXPECT_EQ(short_context.data().tokens().seq_len(), 63);
  const v1::JobSpec long_context = Resolve(
      R"({"model":{"tiny_gpt":{"seq_len":512}},"data":{"tokens":{"path":"/t","dtype":"uint16"}}})");
  EXPECT_EQ(long_context.data().tokens().seq_len(), 128);
  const v1::JobSpec torchscript =
      Resolve(R"({"model":{"torchscript":{"path":"/m.pt","vocab_size":1000}},)"
              R"("data":{"tokens":{"path":"/t","dtype":"uint16"}}})");
  ExpectFullyResolved(torchscript);
  EXPECT_EQ(ModelVocabSize(torchscript), 1000);
  EXPECT_EQ(ModelVocabSource(torchscript), "the model /m.pt's vocab_size");
  EXPECT_EQ(ModelVocabSource(s), "model.tiny_gpt.vocab_size");
  EXPECT_EQ(ModelVocabSize(Resolve(kRegression)), 0);

  // A spec resolved before vocab_size existed (an older coordinator's journal) means bytes.
  v1::JobSpec old = s;
  old.mutable_model()->mutable_tiny_gpt()->clear_vocab_size();
  EXPECT_EQ(ModelVocabSize(old), 256);
}

// SGD, the warmup schedules and fp16 fill their own defaults.
TEST(SpecTest, OptimizerScheduleAndScalerDefaults) {
  const v1::JobSpec sgd = Resolve(Text(R"("optimizer":{"sgd":{}})"));
  EXPECT_EQ(sgd.optimizer().sgd().lr(), 0.01);
  EXPECT_EQ(sgd.optimizer().sgd().momentum(), 0.0);
  EXPECT_EQ(sgd.optimizer().sgd().weight_decay(), 0.0);
  EXPECT_FALSE(sgd.optimizer().has_adamw());

  const v1::JobSpec groups = Resolve(Text(R"("optimizer":{"param_groups":[{"prefix":"a."}]})"));
  EXPECT_TRUE(groups.optimizer().has_adamw());
  EXPECT_EQ(groups.optimizer().param_groups(0).lr_scale(), 1.0);

  const v1::JobSpec cosine =
      Resolve(Text(R"("schedule":{"warmup_cosine":{}},"stop":{"max_updates":300})"));
  EXPECT_EQ(cosine.schedule().warmup_cosine().warmup_updates(), 0);
  EXPECT_EQ(cosine.schedule().warmup_cosine().total_updates(), 300);  // = stop.max_updates
  EXPECT_EQ(cosine.schedule().warmup_cosine().min_lr_ratio(), 0.0);
  EXPECT_FALSE(cosine.stop().has_epochs());  // bounded by max_updates only
  const v1::JobSpec linear = Resolve(Text(R"("schedule":{"warmup_linear":{"total_updates":40}})"));
  EXPECT_EQ(linear.schedule().warmup_linear().total_updates(), 40);
  EXPECT_EQ(linear.stop().epochs(), 1);

  const v1::JobSpec fp16 = Resolve(Text(R"("precision":"fp16")"));
  EXPECT_TRUE(fp16.loss_scaler().enabled());
  EXPECT_EQ(fp16.loss_scaler().init_scale(), 65536.0);
  // The scaler may run in fp32, to test it without fp16 hardware.
  EXPECT_TRUE(Resolve(Text(R"("loss_scaler":{"enabled":true})")).loss_scaler().enabled());
  // microbatch_mean is allowed with either kind of data, to demonstrate the bug.
  EXPECT_EQ(ErrorOf(Text(R"("loss":{"normalization":"microbatch_mean"})")), "OK");
  EXPECT_EQ(ErrorOf(Regression(R"("loss":{"normalization":"microbatch_mean"})")), "OK");
}

// Protobuf's lowerCamelCase JSON names work as well as the .proto names.
TEST(SpecTest, AcceptsLowerCamelCase) {
  const v1::JobSpec s = Resolve(
      R"({"model":{"tinyGpt":{"nLayer":3}},"data":{"text":{"paths":["/c"],"seqLen":32}},)"
      R"("batch":{"microBatchSize":2,"accumulationSteps":3},"lossScaler":{"initScale":8}})");
  EXPECT_EQ(s.model().tiny_gpt().n_layer(), 3);
  EXPECT_EQ(s.data().text().seq_len(), 32);
  EXPECT_EQ(s.batch().micro_batch_size(), 2);
  EXPECT_EQ(s.batch().accumulation_steps(), 3);
  EXPECT_EQ(s.loss_scaler().init_scale(), 8.0);
}

// A spec saved by a Windows editor starts with a byte-order mark.
TEST(SpecTest, IgnoresByteOrderMark) {
  EXPECT_EQ(ErrorOf(absl::StrCat("\xEF\xBB\xBF", kMinimal)), "OK");
}

// ---------------------------------------------------------------------------------------
// One row per rule: the user's mistake, the spec, the exact message.

struct RuleCase {
  std::string name;
  std::string json;
  std::string message;
};

void PrintTo(const RuleCase& c, std::ostream* os) { *os << c.name << ": " << c.json; }

std::vector<RuleCase> RuleCases() {
  const std::string long_name(129, 'n');
  return {
      // A job name pasted from a long description.
      {"NameTooLong", Text(absl::StrCat(R"("name":")", long_name, R"(")")),
       "name must have at most 128 characters, got 129"},
      // A name with a stray control character (it would corrupt logs and tables).
      {"NameControlCharacter", Text(R"("name":"a\u0007b")"),
       R"(name must not contain control characters, got "a\u0007b")"},

      // Forgot the model.
      {"ModelMissing", R"({"data":{"text":{"paths":["/c"]}}})",
       "model is required: one of tiny_gpt, mlp, torchscript, llama"},
      // An mlp fed with text.
      {"MlpOnText", R"({"model":{"mlp":{}},"data":{"text":{"paths":["/c"]}}})",
       "model.mlp needs data.synthetic_regression, got data.text"},
      // A language model fed with regression data.
      {"TinyGptOnRegression", R"({"model":{"tiny_gpt":{}},"data":{"synthetic_regression":{}}})",
       "model.tiny_gpt needs data.text, data.jsonl or data.tokens, got data.synthetic_regression"},
      // A TorchScript language model fed with regression data.
      {"TorchScriptOnRegression",
       R"({"model":{"torchscript":{"path":"/m.pt"}},"data":{"synthetic_regression":{}}})",
       "model.torchscript needs data.text, data.jsonl or data.tokens, got "
       "data.synthetic_regression"},
      // Zero layers.
      {"TinyGptNoLayers",
       R"({"model":{"tiny_gpt":{"n_layer":0}},"data":{"text":{"paths":["/c"]}}})",
       "model.tiny_gpt.n_layer must be ≥ 1, got 0"},
      // Far more layers than a tiny model supports.
      {"TinyGptTooManyLayers",
       R"({"model":{"tiny_gpt":{"n_layer":65}},"data":{"text":{"paths":["/c"]}}})",
       "model.tiny_gpt.n_layer must be ≤ 64, got 65"},
      // Zero attention heads.
      {"TinyGptNoHeads", R"({"model":{"tiny_gpt":{"n_head":0}},"data":{"text":{"paths":["/c"]}}})",
       "model.tiny_gpt.n_head must be ≥ 1, got 0"},
      // A width beyond the limit.
      {"TinyGptTooWide",
       R"({"model":{"tiny_gpt":{"d_model":9000}},"data":{"text":{"paths":["/c"]}}})",
       "model.tiny_gpt.d_model must be ≤ 8192, got 9000"},
      // A width the heads cannot split evenly.
      {"TinyGptWidthNotDivisible",
       R"({"model":{"tiny_gpt":{"d_model":65,"n_head":2}},"data":{"text":{"paths":["/c"]}}})",
       "model.tiny_gpt.d_model must be divisible by model.tiny_gpt.n_head, got 65 and 2"},
      // A context of one token (nothing to predict).
      {"TinyGptContextTooShort",
       R"({"model":{"tiny_gpt":{"seq_len":1}},"data":{"text":{"paths":["/c"]}}})",
       "model.tiny_gpt.seq_len must be ≥ 2, got 1"},
      // Different feature counts for the model and the data.
      {"MlpInFeaturesMismatch",
       R"({"model":{"mlp":{"in_features":16}},"data":{"synthetic_regression":{"in_features":8}}})",
       "model.mlp.in_features must equal data.synthetic_regression.in_features, got 16 and 8"},
      // Zero input features.
      {"MlpNoInFeatures",
       R"({"model":{"mlp":{"in_features":0}},"data":{"synthetic_regression":{}}})",
       "model.mlp.in_features must be ≥ 1, got 0"},
      // A hidden layer of width zero.
      {"MlpNoHidden", R"({"model":{"mlp":{"hidden":0}},"data":{"synthetic_regression":{}}})",
       "model.mlp.hidden must be ≥ 1, got 0"},
      // An absurd output width.
      {"MlpTooManyOutputs",
       R"({"model":{"mlp":{"out_features":70000}},"data":{"synthetic_regression":{}}})",
       "model.mlp.out_features must be ≤ 65536, got 70000"},
      // Chose TorchScript and forgot the file.
      {"TorchScriptNoPath", R"({"model":{"torchscript":{}},"data":{"jsonl":{"path":"/d"}}})",
       "model.torchscript.path is required: the TorchScript file whose forward(input_ids) "
       "returns logits, got \"\""},
      // A one-token vocabulary for the built-in model.
      {"TinyGptVocabTooSmall",
       R"({"model":{"tiny_gpt":{"vocab_size":1}},"data":{"jsonl":{"path":"/d"}}})",
       "model.tiny_gpt.vocab_size must be ≥ 2, got 1"},
      // A vocabulary no tiny model has room for.
      {"TinyGptVocabTooLarge",
       R"({"model":{"tiny_gpt":{"vocab_size":1000001}},"data":{"jsonl":{"path":"/d"}}})",
       "model.tiny_gpt.vocab_size must be ≤ 1000000, got 1000001"},
      // A one-token vocabulary.
      {"TorchScriptVocabTooSmall",
       R"({"model":{"torchscript":{"path":"/m.pt","vocab_size":1}},"data":{"jsonl":{"path":"/d"}}})",
       "model.torchscript.vocab_size must be ≥ 2, got 1"},

      // Forgot the data.
      {"DataMissing", R"({"model":{"tiny_gpt":{}}})",
       "data is required: one of text, jsonl, synthetic_regression, tokens"},
      // Chose text and listed no files.
      {"TextNoPaths", R"({"model":{"tiny_gpt":{}},"data":{"text":{}}})",
       "data.text.paths must list at least one file or directory, got []"},
      // An empty string in the file list.
      {"TextEmptyPath", R"({"model":{"tiny_gpt":{}},"data":{"text":{"paths":["/c",""]}}})",
       "data.text.paths[1] must not be empty, got \"\""},
      // Chose a token file and named none.
      {"TokensNoPath", R"({"model":{"tiny_gpt":{}},"data":{"tokens":{"dtype":"uint16"}}})",
       "data.tokens.path is required: a flat file of little-endian token ids (nanoGPT's "
       "train.bin), got \"\""},
      // No dtype: guessing one would misread every id.
      {"TokensNoDtype", R"({"model":{"tiny_gpt":{}},"data":{"tokens":{"path":"/t.bin"}}})",
       "data.tokens.dtype is required: uint16, uint32 (the width of the ids in the file; no "
       "default, since ids read with the wrong width are silently wrong)"},
      // A dtype given as a number that names none.
      {"TokensDtypeUnknownNumber",
       R"({"model":{"tiny_gpt":{}},"data":{"tokens":{"path":"/t.bin","dtype":7}}})",
       "data.tokens.dtype must be one of uint16, uint32, got 7"},
      // seq_len 0 would make samples of one token: nothing to predict.
      {"TokensSeqLenZero",
       R"({"model":{"tiny_gpt":{}},"data":{"tokens":{"path":"/t.bin","dtype":"uint16","seq_len":0}}})",
       "data.tokens.seq_len must be ≥ 1, got 0"},
      // Longer than any model context (65536) once the extra token is added.
      {"TokensSeqLenTooLong",
       R"({"model":{"torchscript":{"path":"/m.pt"}},)"
       R"("data":{"tokens":{"path":"/t.bin","dtype":"uint32","seq_len":65536}}})",
       "data.tokens.seq_len must be ≤ 65535, got 65536"},
      // A sample (seq_len + 1 tokens) longer than the model's context.
      {"TokensLongerThanContext",
       R"({"model":{"tiny_gpt":{"seq_len":64}},)"
       R"("data":{"tokens":{"path":"/t.bin","dtype":"uint16","seq_len":64}}})",
       "data.tokens.seq_len must be < model.tiny_gpt.seq_len (a sample is seq_len + 1 tokens "
       "and must fit the model's context), got 64 and 64"},
      // An mlp fed with a token file.
      {"MlpOnTokens",
       R"({"model":{"mlp":{}},"data":{"tokens":{"path":"/t.bin","dtype":"uint16"}}})",
       "model.mlp needs data.synthetic_regression, got data.tokens"},
      // A sample length beyond the limit.
      {"TextSeqLenTooLong",
       R"({"model":{"tiny_gpt":{}},"data":{"text":{"paths":["/c"],"seq_len":70000}}})",
       "data.text.seq_len must be ≤ 65536, got 70000"},
      // A one-token sample length the model inherits: the data field is blamed.
      {"TextSeqLenTooShort",
       R"({"model":{"tiny_gpt":{}},"data":{"text":{"paths":["/c"],"seq_len":1}}})",
       "data.text.seq_len must be ≥ 2, got 1"},
      // Samples longer than the model's context.
      {"TextSeqLenExceedsContext",
       R"({"model":{"tiny_gpt":{"seq_len":64}},"data":{"text":{"paths":["/c"],"seq_len":128}}})",
       "data.text.seq_len must be ≤ model.tiny_gpt.seq_len (samples must fit the model's "
       "context), got 128 and 64"},
      // Chose JSONL and forgot the file.
      {"JsonlNoPath", R"({"model":{"tiny_gpt":{}},"data":{"jsonl":{}}})",
       "data.jsonl.path is required: a file with one {\"input_ids\": [...], \"labels\": [...]} "
       "per line, got \"\""},
      // An empty synthetic data set.
      {"RegressionNoSamples",
       R"({"model":{"mlp":{}},"data":{"synthetic_regression":{"samples":0}}})",
       "data.synthetic_regression.samples must be ≥ 1, got 0"},
      // A synthetic data set too large to generate.
      {"RegressionTooManySamples",
       R"({"model":{"mlp":{}},"data":{"synthetic_regression":{"samples":200000000}}})",
       "data.synthetic_regression.samples must be ≤ 100000000, got 200000000"},
      // Synthetic data without features.
      {"RegressionNoFeatures",
       R"({"model":{"mlp":{}},"data":{"synthetic_regression":{"in_features":0}}})",
       "data.synthetic_regression.in_features must be ≥ 1, got 0"},

      // A micro-batch of zero samples.
      {"MicroBatchZero", Text(R"("batch":{"micro_batch_size":0})"),
       "batch.micro_batch_size must be ≥ 1, got 0"},
      // A micro-batch beyond the limit.
      {"MicroBatchTooLarge", Text(R"("batch":{"micro_batch_size":65537})"),
       "batch.micro_batch_size must be ≤ 65536, got 65537"},
      // Zero accumulation steps (meant "no accumulation", which is 1).
      {"AccumulationZero", Text(R"("batch":{"accumulation_steps":0})"),
       "batch.accumulation_steps must be ≥ 1, got 0"},
      // An accumulation count beyond the limit.
      {"AccumulationTooLarge", Text(R"("batch":{"accumulation_steps":70000})"),
       "batch.accumulation_steps must be ≤ 65536, got 70000"},
      // A tail policy given as a number that names no policy.
      {"TailUnknownNumber", Text(R"("batch":{"tail":7})"),
       "batch.tail must be one of dynamic, drop, got 7"},

      // A precision given as a number that names no precision.
      {"PrecisionUnknownNumber", Text(R"("precision":9)"),
       "precision must be one of fp32, bf16, fp16, got 9"},

      // Token normalization asked for sample-level data.
      {"TokensOnRegression", Regression(R"("loss":{"normalization":"tokens"})"),
       "loss.normalization tokens needs token data (data.text, data.jsonl or data.tokens); "
       "synthetic_regression is sample-level: use samples"},
      // Sample normalization asked for text (short samples would be up-weighted).
      {"SamplesOnText", Text(R"("loss":{"normalization":"samples"})"),
       "loss.normalization samples needs sample data (data.synthetic_regression); "
       "text is token-level: use tokens"},
      // Sample normalization asked for JSONL.
      {"SamplesOnJsonl",
       R"({"model":{"tiny_gpt":{}},"data":{"jsonl":{"path":"/d"}},"loss":{"normalization":"samples"}})",
       "loss.normalization samples needs sample data (data.synthetic_regression); "
       "jsonl is token-level: use tokens"},
      // Sample normalization asked for a token file.
      {"SamplesOnTokens",
       R"({"model":{"tiny_gpt":{}},"data":{"tokens":{"path":"/t.bin","dtype":"uint16"}},)"
       R"("loss":{"normalization":"samples"}})",
       "loss.normalization samples needs sample data (data.synthetic_regression); "
       "tokens is token-level: use tokens"},
      // A normalization given as a number that names none.
      {"NormalizationUnknownNumber", Text(R"("loss":{"normalization":4})"),
       "loss.normalization must be one of tokens, samples, microbatch_mean, got 4"},

      // A zero learning rate (nothing would train).
      {"AdamwLrZero", Text(R"("optimizer":{"adamw":{"lr":0}})"),
       "optimizer.adamw.lr must be > 0, got 0"},
      // A NaN learning rate.
      {"AdamwLrNaN", Text(R"("optimizer":{"adamw":{"lr":"NaN"}})"),
       "optimizer.adamw.lr must be finite, got NaN"},
      // An infinite learning rate.
      {"AdamwLrInfinite", Text(R"("optimizer":{"adamw":{"lr":"Infinity"}})"),
       "optimizer.adamw.lr must be finite, got Infinity"},
      // beta1 of 1 (the moment would never move).
      {"AdamwBeta1One", Text(R"("optimizer":{"adamw":{"beta1":1}})"),
       "optimizer.adamw.beta1 must be in [0, 1), got 1"},
      // A negative beta2.
      {"AdamwBeta2Negative", Text(R"("optimizer":{"adamw":{"beta2":-0.1}})"),
       "optimizer.adamw.beta2 must be in [0, 1), got -0.1"},
      // eps of zero (division by zero on a zero second moment).
      {"AdamwEpsZero", Text(R"("optimizer":{"adamw":{"eps":0}})"),
       "optimizer.adamw.eps must be > 0, got 0"},
      // A negative weight decay.
      {"AdamwNegativeDecay", Text(R"("optimizer":{"adamw":{"weight_decay":-1}})"),
       "optimizer.adamw.weight_decay must be ≥ 0, got -1"},
      // A negative SGD learning rate.
      {"SgdLrNegative", Text(R"("optimizer":{"sgd":{"lr":-0.1}})"),
       "optimizer.sgd.lr must be > 0, got -0.1"},
      // Momentum of 1 (velocity never decays).
      {"SgdMomentumOne", Text(R"("optimizer":{"sgd":{"momentum":1}})"),
       "optimizer.sgd.momentum must be in [0, 1), got 1"},
      // A negative SGD weight decay.
      {"SgdNegativeDecay", Text(R"("optimizer":{"sgd":{"weight_decay":-0.5}})"),
       "optimizer.sgd.weight_decay must be ≥ 0, got -0.5"},
      // A param group with no prefix (it would match every parameter).
      {"ParamGroupEmptyPrefix", Text(R"("optimizer":{"param_groups":[{"prefix":""}]})"),
       "optimizer.param_groups[0].prefix must not be empty, got \"\""},
      // The same param group twice.
      {"ParamGroupDuplicate",
       Text(R"("optimizer":{"param_groups":[{"prefix":"blocks."},{"prefix":"blocks."}]})"),
       "optimizer.param_groups[1].prefix must be unique, got \"blocks.\" (also at "
       "optimizer.param_groups[0].prefix)"},
      // A negative lr_scale.
      {"ParamGroupNegativeScale",
       Text(R"("optimizer":{"param_groups":[{"prefix":"a.","lr_scale":-1}]})"),
       "optimizer.param_groups[0].lr_scale must be ≥ 0, got -1"},
      // A NaN lr_scale.
      {"ParamGroupNaNScale",
       Text(R"("optimizer":{"param_groups":[{"prefix":"a.","lr_scale":"NaN"}]})"),
       "optimizer.param_groups[0].lr_scale must be finite, got NaN"},
      // An empty frozen prefix (it would freeze everything).
      {"FrozenEmptyPrefix", Text(R"("optimizer":{"frozen_prefixes":[""]})"),
       "optimizer.frozen_prefixes[0] must not be empty, got \"\""},
      // The same frozen prefix twice.
      {"FrozenDuplicate", Text(R"("optimizer":{"frozen_prefixes":["a.","b.","a."]})"),
       "optimizer.frozen_prefixes[2] must be unique, got \"a.\" (also at "
       "optimizer.frozen_prefixes[0])"},
      // A prefix both frozen and trained.
      {"FrozenAndGroup",
       Text(R"("optimizer":{"param_groups":[{"prefix":"x."},{"prefix":"head."}],)"
            R"("frozen_prefixes":["head."]})"),
       "optimizer.frozen_prefixes[0] must not also be a param group prefix (frozen parameters "
       "are in no optimizer), got \"head.\" (also optimizer.param_groups[1].prefix)"},

      // A cosine schedule with no end.
      {"CosineNoEnd", Text(R"("schedule":{"warmup_cosine":{}})"),
       "schedule.warmup_cosine.total_updates is required when stop.max_updates is not set"},
      // A linear schedule with no end.
      {"LinearNoEnd", Text(R"("schedule":{"warmup_linear":{"warmup_updates":3}})"),
       "schedule.warmup_linear.total_updates is required when stop.max_updates is not set"},
      // A negative warmup.
      {"WarmupNegative",
       Text(R"("schedule":{"warmup_cosine":{"warmup_updates":-1,"total_updates":10}})"),
       "schedule.warmup_cosine.warmup_updates must be ≥ 0, got -1"},
      // A schedule of zero updates.
      {"TotalZero", Text(R"("schedule":{"warmup_cosine":{"total_updates":0}})"),
       "schedule.warmup_cosine.total_updates must be ≥ 1, got 0"},
      // A warmup longer than the whole schedule.
      {"WarmupLongerThanTotal",
       Text(R"("schedule":{"warmup_cosine":{"warmup_updates":10,"total_updates":5}})"),
       "schedule.warmup_cosine.total_updates must be ≥ schedule.warmup_cosine.warmup_updates, "
       "got 5 and 10"},
      // A warmup longer than the run it defaults its end from.
      {"WarmupLongerThanRun",
       Text(R"("schedule":{"warmup_linear":{"warmup_updates":10}},"stop":{"max_updates":5})"),
       "schedule.warmup_linear.total_updates (from stop.max_updates) must be ≥ "
       "schedule.warmup_linear.warmup_updates, got 5 and 10"},
      // A final lr above the peak.
      {"MinLrRatioAboveOne",
       Text(R"("schedule":{"warmup_cosine":{"total_updates":10,"min_lr_ratio":1.5}})"),
       "schedule.warmup_cosine.min_lr_ratio must be in [0, 1], got 1.5"},

      // Clipping to norm zero (erases every update); unset means no clipping.
      {"ClipZero", Text(R"("clip":{"max_grad_norm":0})"), "clip.max_grad_norm must be > 0, got 0"},
      // An infinite clip norm (leave it unset instead).
      {"ClipInfinite", Text(R"("clip":{"max_grad_norm":"Infinity"})"),
       "clip.max_grad_norm must be finite, got Infinity"},

      // A scaler with bf16, which needs none.
      {"ScalerWithBf16", Text(R"("precision":"bf16","loss_scaler":{"enabled":true})"),
       "loss_scaler.enabled must be false with precision bf16: bf16 has fp32's range and needs "
       "no scaler"},
      // fp16 with the scaler switched off.
      {"Fp16WithoutScaler", Text(R"("precision":"fp16","loss_scaler":{"enabled":false})"),
       "loss_scaler.enabled must be true with precision fp16: fp16 gradients underflow without "
       "a scaler"},
      // A zero initial scale.
      {"InitScaleZero", Text(R"("loss_scaler":{"init_scale":0})"),
       "loss_scaler.init_scale must be > 0, got 0"},
      // A growth factor that does not grow.
      {"GrowthFactorOne", Text(R"("loss_scaler":{"growth_factor":1})"),
       "loss_scaler.growth_factor must be > 1, got 1"},
      // A backoff that does not back off.
      {"BackoffFactorOne", Text(R"("loss_scaler":{"backoff_factor":1})"),
       "loss_scaler.backoff_factor must be in (0, 1), got 1"},
      // A zero growth interval.
      {"GrowthIntervalZero", Text(R"("loss_scaler":{"growth_interval":0})"),
       "loss_scaler.growth_interval must be ≥ 1, got 0"},
      // Zero hysteresis.
      {"HysteresisZero", Text(R"("loss_scaler":{"hysteresis":0})"),
       "loss_scaler.hysteresis must be ≥ 1, got 0"},
      // A negative floor.
      {"MinScaleNegative", Text(R"("loss_scaler":{"min_scale":-1})"),
       "loss_scaler.min_scale must be ≥ 0, got -1"},
      // A floor above the starting scale.
      {"MinScaleAboveInit", Text(R"("loss_scaler":{"init_scale":10,"min_scale":100})"),
       "loss_scaler.min_scale must be ≤ loss_scaler.init_scale, got 100 and 10"},

      // A run of zero updates.
      {"MaxUpdatesZero", Text(R"("stop":{"max_updates":0})"),
       "stop.max_updates must be ≥ 1, got 0"},
      // A schedule defaulting its end from a bad max_updates: the stop field is blamed.
      {"MaxUpdatesZeroWithSchedule",
       Text(R"("schedule":{"warmup_cosine":{}},"stop":{"max_updates":0})"),
       "stop.max_updates must be ≥ 1, got 0"},
      // Zero epochs.
      {"EpochsZero", Text(R"("stop":{"epochs":0})"), "stop.epochs must be ≥ 1, got 0"},

      // A checkpoint every zero updates.
      {"CheckpointEveryZero", Text(R"("checkpoint":{"dir":"/c","every_updates":0})"),
       "checkpoint.every_updates must be ≥ 1, got 0"},
      // A negative retention count (0 keeps all).
      {"KeepLastNegative", Text(R"("checkpoint":{"keep_last":-1})"),
       "checkpoint.keep_last must be ≥ 0, got -1"},

      // No workers.
      {"WorkersZero", Text(R"("workers":{"count":0})"), "workers.count must be ≥ 1, got 0"},
      // Scores smoothed over no window, or over more than any job keeps in mind.
      {"ScoreWindowsZero", Text(R"("stragglers":{"score_windows":0})"),
       "stragglers.score_windows must be ≥ 1, got 0"},
      {"ScoreWindowsTooMany", Text(R"("stragglers":{"score_windows":10001})"),
       "stragglers.score_windows must be ≤ 10000, got 10001"},
      // A replacement threshold no score can be below, or every score is below.
      {"ReplaceBelowZero", Text(R"("stragglers":{"replace_below":0})"),
       "stragglers.replace_below must be in (0, 1), got 0"},
      {"ReplaceBelowOne", Text(R"("stragglers":{"replace_below":1})"),
       "stragglers.replace_below must be in (0, 1), got 1"},
      {"ReplaceAfterZero", Text(R"("stragglers":{"replace_below":0.5,"replace_after_windows":0})"),
       "stragglers.replace_after_windows must be ≥ 1, got 0"},
      // Re-runs: a trigger twice, a spike measured against nothing or no spread, no patience.
      {"RerunOnTwice", Text(R"("validate":{"rerun_on":["spike","spike"]})"),
       "validate.rerun_on[1] must be unique, got spike (also at validate.rerun_on[0])"},
      {"SpikeSigmaZero", Text(R"("validate":{"spike_sigma":0})"),
       "validate.spike_sigma must be > 0, got 0"},
      {"SpikeWindowOne", Text(R"("validate":{"spike_window":1})"),
       "validate.spike_window must be ≥ 2, got 1"},
      {"MaxSuspectZero", Text(R"("validate":{"max_suspect":0})"),
       "validate.max_suspect must be ≥ 1, got 0"},
      // A model whose operations may not reproduce: a re-run could not tell a fault.
      {"RerunWithTorchScript",
       R"({"model":{"torchscript":{"path":"/m.pt"}},"data":{"text":{"paths":["/c"]}},)"
       R"("validate":{"rerun_on":["nonfinite"]}})",
       "validate.rerun_on needs a built-in model (mlp, tiny_gpt): a TorchScript model's "
       "operations may not reproduce bit for bit, and a re-run could not tell a fault from them"},
      // A streak length for a policy that is off: the user meant to turn it on.
      {"ReplaceAfterWithoutBelow", Text(R"("stragglers":{"replace_after_windows":5})"),
       "stragglers.replace_after_windows needs stragglers.replace_below (the relative score a "
       "rank must stay below to be replaced)"},
      // More workers than supported.
      {"WorkersTooMany", Text(R"("workers":{"count":1025})"),
       "workers.count must be ≤ 1024, got 1025"},
      // Elastic: fewer than one rank, or a minimum above the target world size.
      {"WorkersMinZero", Text(R"("workers":{"count":2,"min":0})"),
       "workers.min must be ≥ 1, got 0"},
      {"WorkersMinAboveCount", Text(R"("workers":{"count":2,"min":3})"),
       "workers.min must be ≤ 2, got 3"},
      // A negative grace, or one over a day.
      {"JoinGraceNegative", Text(R"("workers":{"count":2,"join_grace":"-1s"})"),
       "workers.join_grace must be between 0s and 86400s, got -1s"},
      {"JoinGraceTooLong", Text(R"("workers":{"count":2,"join_grace":"86401s"})"),
       "workers.join_grace must be between 0s and 86400s, got 86401s"},
      // Hang detection: a floor a busy host would trip, a cap below it, a factor that fences
      // a rank for being as slow as its own last window.
      {"HangFloorUnderASecond", Text(R"("hang":{"floor":"0.5s"})"),
       "hang.floor must be at least 1s, got 500ms"},
      {"HangCapBelowFloor", Text(R"("hang":{"floor":"20s","cap":"10s"})"),
       "hang.cap (10s) must not be below hang.floor (20s)"},
      {"HangCapOverADay", Text(R"("hang":{"cap":"90000s"})"),
       "hang.cap must be between 0s and 86400s, got 90000s"},
      {"HangFactorBelowOne", Text(R"("hang":{"factor":0.5})"),
       "hang.factor must be in [1, 1000], got 0.5"},

      // Two mistakes: the one earlier in spec.proto is reported, always.
      {"FirstErrorInProtoOrder", Text(R"("workers":{"count":0},"batch":{"accumulation_steps":0})"),
       "batch.accumulation_steps must be ≥ 1, got 0"},
      // Held-out evaluation: its data is resolved like data, with its own path in messages.
      {"EvalWithoutData", Text(R"("eval":{})"),
       "eval.data is required: one of text, jsonl, synthetic_regression, tokens"},
      {"EvalEmptyPaths", Text(R"("eval":{"data":{"text":{"paths":[]}}})"),
       "eval.data.text.paths must list at least one file or directory, got []"},
      {"EvalTokensWithoutDtype", Text(R"("eval":{"data":{"tokens":{"path":"/v.bin"}}})"),
       "eval.data.tokens.dtype is required: uint16, uint32 (the width of the ids in the file; no "
       "default, since ids read with the wrong width are silently wrong)"},
      {"EvalSeqLenBeyondTheModel",
       R"({"model":{"tiny_gpt":{"seq_len":64}},"data":{"text":{"paths":["/c"],"seq_len":64}},)"
       R"("eval":{"data":{"text":{"paths":["/v"],"seq_len":65}}}})",
       "eval.data.text.seq_len must be ≤ model.tiny_gpt.seq_len (samples must fit the model's "
       "context), got 65 and 64"},
      {"EvalOfAnotherLevel", Text(R"("eval":{"data":{"synthetic_regression":{}}})"),
       "eval.data must be data.text, data.jsonl or data.tokens like data (data.text), got "
       "eval.data.synthetic_regression"},
      {"EvalFeaturesDiffer",
       Regression(R"("eval":{"data":{"synthetic_regression":{"in_features":3}}})"),
       "eval.data.synthetic_regression.in_features must equal model.mlp.in_features, got 3 and 8"},
      {"EvalShuffled", Text(R"("eval":{"data":{"text":{"paths":["/v"]},"shuffle":true}})"),
       "eval.data.shuffle must be false (evaluation reads every sample once), got true"},
      {"EvalEveryZero", Text(R"("eval":{"data":{"text":{"paths":["/v"]}},"every_updates":0})"),
       "eval.every_updates must be ≥ 1, got 0"},
      {"EvalMaxBatchesZero", Text(R"("eval":{"data":{"text":{"paths":["/v"]}},"max_batches":0})"),
       "eval.max_batches must be ≥ 1, got 0"},
      // Neither model nor data: model comes first.
      {"EmptySpec", "{}", "model is required: one of tiny_gpt, mlp, torchscript, llama"},
  };
}

class SpecRuleTest : public ::testing::TestWithParam<RuleCase> {};

TEST_P(SpecRuleTest, ReportsTheBrokenRule) {
  EXPECT_EQ(ErrorOf(GetParam().json), GetParam().message);
}

INSTANTIATE_TEST_SUITE_P(Rules, SpecRuleTest, ::testing::ValuesIn(RuleCases()),
                         [](const ::testing::TestParamInfo<RuleCase>& info) {
                           return info.param.name;
                         });

// A held-out set gets the training data's defaults: samples that fit the model, read in
// order, every 100 updates, all of it. Catches: an eval.data left unresolved (the worker would
// read seq_len 0) or defaults that differ from data's.
TEST(SpecTest, EvalDefaults) {
  absl::StatusOr<v1::JobSpec> spec = ParseAndResolveJobSpec(
      R"({"model":{"tiny_gpt":{"seq_len":48}},"data":{"tokens":{"path":"/t.bin","dtype":"uint16"}},)"
      R"("eval":{"data":{"tokens":{"path":"/v.bin","dtype":"uint16"}}}})");
  ASSERT_TRUE(spec.ok()) << spec.status();
  ExpectFullyResolved(*spec);
  EXPECT_EQ(spec->eval().data().tokens().seq_len(), 47);  // like data.tokens: fits the model
  EXPECT_FALSE(spec->eval().data().shuffle());
  EXPECT_EQ(spec->eval().every_updates(), 100);
  EXPECT_FALSE(spec->eval().has_max_batches());
  absl::StatusOr<v1::JobSpec> again = ResolveJobSpec(*spec);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->SerializeAsString(), spec->SerializeAsString());
  EXPECT_FALSE(ParseAndResolveJobSpec(kMinimal)->has_eval());  // no eval unless asked
}

// ---------------------------------------------------------------------------------------
// Parse errors: protobuf's messages rewritten so that a user knows what to change.

std::vector<RuleCase> ParseErrorCases() {
  return {
      // A typo in a field name.
      {"UnknownField", R"({"batch":{"micro_batch_sizee":4}})",
       "batch.micro_batch_sizee: unknown field; batch accepts: micro_batch_size, "
       "accumulation_steps, tail"},
      // A field put at the wrong level.
      {"UnknownTopLevelField", R"({"micro_batch_size":4})",
       "micro_batch_size: unknown field; the spec accepts: name, seed, model, data, batch, "
       "precision, loss, optimizer, schedule, clip, loss_scaler, stop, checkpoint, workers, "
       "eval, stragglers, validate, hang"},
      // The test hook that left the spec (field 15, reserved): where it went, not a field list.
      {"RemovedDebugSection", R"({"debug":{"nonfinite_grad_windows":[3]}})",
       "debug: no longer a spec field; faults are injected by the testing worker's flags "
       "(build/bin/testing/trainstep-worker --debug-nonfinite-grad-windows=W,…; "
       "docs/development.md)"},
      // A typo inside a list element.
      {"UnknownFieldInList", R"({"optimizer":{"param_groups":[{"prefixx":"a."}]}})",
       "optimizer.param_groups[0].prefixx: unknown field; optimizer.param_groups[0] accepts: "
       "prefix, lr_scale"},
      // A typo under a lowerCamelCase parent: the path uses the .proto names.
      {"UnknownFieldUnderCamelCase", R"({"lossScaler":{"initscale":2}})",
       "loss_scaler.initscale: unknown field; loss_scaler accepts: enabled, init_scale, "
       "growth_factor, backoff_factor, growth_interval, hysteresis, min_scale"},
      // A precision that does not exist.
      {"BadEnum", R"({"precision":"fp8"})", R"(precision: "fp8" is not one of fp32, bf16, fp16)"},
      // A token width that does not exist.
      {"BadTokensDtype", R"({"data":{"tokens":{"dtype":"int8"}}})",
       R"(data.tokens.dtype: "int8" is not one of uint16, uint32)"},
      // Enum names are case-sensitive.
      {"BadEnumCase", R"({"batch":{"tail":"Drop"}})",
       R"(batch.tail: "Drop" is not one of dynamic, drop)"},
      // A stray newline inside an enum value: shown escaped, as it was written.
      {"BadEnumWithNewline", R"({"precision":"bf\n16"})",
       R"(precision: "bf\u000a16" is not one of fp32, bf16, fp16)"},
      // A stray newline inside a key: shown escaped.
      {"UnknownFieldWithNewline", R"({"data":{"shuf\nfle":true}})",
       R"(data."shuf\u000afle": unknown field; data accepts: text, jsonl, synthetic_regression, )"
       R"(tokens, shuffle)"},
      // An enum given as a boolean.
      {"EnumWrongType", R"({"precision":true})",
       "precision: expected one of fp32, bf16, fp16, got true"},
      // A fractional integer.
      {"FractionalInteger", R"({"batch":{"micro_batch_size":4.5}})",
       "batch.micro_batch_size: expected an integer, got 4.5"},
      // A word where a count goes.
      {"StringForInteger", R"({"batch":{"micro_batch_size":"four"}})",
       R"(batch.micro_batch_size: expected an integer, got "four")"},
      // A count beyond 32 bits.
      {"IntegerOutOfRange", R"({"batch":{"micro_batch_size":99999999999}})",
       "batch.micro_batch_size: expected an integer from -2147483648 to 2147483647, got "
       "99999999999"},
      // A negative seed.
      {"NegativeSeed", R"({"seed":-1})",
       "seed: expected an integer from 0 to 18446744073709551615, got -1"},
      // A word where a number goes.
      {"StringForNumber", R"({"optimizer":{"adamw":{"lr":"fast"}}})",
       R"(optimizer.adamw.lr: expected a number, got "fast")"},
      // A number where a string goes.
      {"NumberForString", R"({"name":4})", "name: expected a string, got 4"},
      // 1 for true.
      {"NumberForBool", R"({"data":{"shuffle":1}})", "data.shuffle: expected true or false, got 1"},
      // A number in a list of paths.
      {"NumberInStringList", R"({"data":{"text":{"paths":[1]}}})",
       "data.text.paths[0]: expected a string, got 1"},
      // A scalar where an object goes.
      {"ScalarForObject", R"({"batch":5})", "batch: expected an object, got 5"},
      // A scalar where a list of objects goes.
      {"ScalarForListOfObjects", R"({"optimizer":{"param_groups":5}})",
       "optimizer.param_groups: expected a list of objects, got 5"},
      // An object where a string goes.
      {"ObjectForScalar", R"({"name":{}})", "name: expected a string, got an object"},
      // A list where a number goes.
      {"ListForScalar", R"({"optimizer":{"adamw":{"lr":[0.1]}}})",
       "optimizer.adamw.lr: expected a number, got a list"},
      // Two models at once.
      {"TwoOneofMembers", R"({"model":{"tiny_gpt":{},"mlp":{}}})",
       "model: give only one of tiny_gpt, mlp, torchscript, llama, got mlp and another"},
      // The same field under both of its names.
      {"FieldGivenTwice", R"({"batch":{"microBatchSize":3,"micro_batch_size":4}})",
       "batch.micro_batch_size: given more than once (perhaps as both micro_batch_size and "
       "microBatchSize); give it once"},
      // A list instead of an object at the top.
      {"RootNotObject", "[1]", "spec must be a JSON object, got a list"},
      // A literal null.
      {"RootNull", " null", "spec must be a JSON object, got null"},
      // An empty file.
      {"Empty", "",
       "spec is not valid JSON at line 1, column 1: Unexpected end of string. Expected a value."},
      // A value left out, on line 3.
      {"MissingValue", "{\n  \"name\": \"a\",\n  \"seed\": ,\n  \"precision\": \"fp32\"\n}",
       "spec is not valid JSON at line 3, column 11: Unexpected token."},
      // A file cut short.
      {"Truncated", R"({"name": "x")",
       "spec is not valid JSON at line 1, column 13: Unexpected end of string. Expected , or } "
       "after key:value pair."},
      // Junk after the object.
      {"TrailingJunk", R"({"name": "x"} junk)",
       "spec is not valid JSON at line 1, column 15: Parsing terminated before end of input."},
      // An unquoted enum value deep in a longer, repetitive file (columns count characters).
      {"UnquotedValueFarIn",
       "{\n  \"name\": \"été\",\n  \"batch\": {\"tail\": \"dynamic\"},\n"
       "  \"loss\": {\"normalization\": tokens}\n}",
       "spec is not valid JSON at line 4, column 29: Unexpected token."},
      // A bad value after non-ASCII text: the column counts characters, as editors do.
      {"ColumnCountsCharacters", R"({"name": "été", "seed": x})",
       "spec is not valid JSON at line 1, column 25: Unexpected token."},
  };
}

class SpecParseErrorTest : public ::testing::TestWithParam<RuleCase> {};

TEST_P(SpecParseErrorTest, NamesTheFieldAndTheFix) {
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecJson(GetParam().json);
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(spec.status().message()), GetParam().message);
}

INSTANTIATE_TEST_SUITE_P(ParseErrors, SpecParseErrorTest, ::testing::ValuesIn(ParseErrorCases()),
                         [](const ::testing::TestParamInfo<RuleCase>& info) {
                           return info.param.name;
                         });

// ---------------------------------------------------------------------------------------
// Properties of resolved specs.

std::vector<std::string> ValidSpecs() {
  return {
      kMinimal,
      kBriefExample,
      kFull,
      kRegression,
      kTorchScriptText,
      Text(R"("optimizer":{"sgd":{}},"schedule":{"warmup_linear":{}},"stop":{"max_updates":9})"),
      Text(R"("precision":"fp16","clip":{"max_grad_norm":2.5})"),
      R"({"model":{"tiny_gpt":{"seq_len":64}},"data":{"text":{"paths":["/c"]}}})",
      R"({"model":{"mlp":{"in_features":3}},"data":{"synthetic_regression":{}}})"};
}

// A coordinator that re-resolves a stored spec (after a restart) must get the same job.
TEST(SpecTest, ResolveIsIdempotent) {
  for (const std::string& json : ValidSpecs()) {
    const v1::JobSpec once = Resolve(json);
    absl::StatusOr<v1::JobSpec> twice = ResolveJobSpec(once);
    ASSERT_TRUE(twice.ok()) << twice.status() << "\n" << json;
    EXPECT_TRUE(MessageDifferencer::Equals(once, *twice)) << json;
    EXPECT_EQ(once.SerializeAsString(), twice->SerializeAsString()) << json;
    EXPECT_EQ(JobSpecHash(once), JobSpecHash(*twice)) << json;
  }
}

// A resolved spec written out as JSON (for workers, `job get -o json`) reads back unchanged.
TEST(SpecTest, ResolvedSpecRoundTripsThroughJson) {
  for (const std::string& json : ValidSpecs()) {
    const v1::JobSpec resolved = Resolve(json);
    for (bool pretty : {false, true}) {
      const std::string text = JobSpecToJson(resolved, pretty);
      const v1::JobSpec back = Parse(text);
      EXPECT_TRUE(MessageDifferencer::Equals(resolved, back)) << text;
      EXPECT_EQ(JobSpecHash(resolved), JobSpecHash(back)) << text;
    }
  }
}

// Catches the spec fuzzer's finding: protobuf prints -0.0 as "-0" and reads "-0" as +0, so a
// spec holding -0.0 printed (for workers, `job get`) read back as another message, with
// another hash. -0 now reads as 0, also inside repeated messages and in a spec that arrives
// as a message rather than JSON.
TEST(SpecTest, NegativeZeroReadsAsZeroSoPrintingRoundTrips) {
  const v1::JobSpec parsed =
      Parse(R"({"model":{"tiny_gpt":{}},"data":{"text":{"paths":["/usr/share/common-licenses"]}},)"
            R"("clip":{"max_grad_norm":-0.0},"optimizer":{"adamw":{"lr":0.001,"weight_decay":-0},)"
            R"("param_groups":[{"prefix":"embed","lr_scale":-0.0}]}})");
  ASSERT_TRUE(parsed.clip().has_max_grad_norm());
  EXPECT_FALSE(std::signbit(parsed.clip().max_grad_norm()));
  EXPECT_FALSE(std::signbit(parsed.optimizer().adamw().weight_decay()));
  ASSERT_EQ(parsed.optimizer().param_groups_size(), 1);
  EXPECT_FALSE(std::signbit(parsed.optimizer().param_groups(0).lr_scale()));
  EXPECT_EQ(Parse(JobSpecToJson(parsed)).SerializeAsString(), parsed.SerializeAsString());

  v1::JobSpec message = Parse(kMinimal);
  message.mutable_optimizer()->mutable_adamw()->set_weight_decay(-0.0);
  absl::StatusOr<v1::JobSpec> resolved = ResolveJobSpec(message);
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_FALSE(std::signbit(resolved->optimizer().adamw().weight_decay()));
  EXPECT_EQ(Parse(JobSpecToJson(*resolved)).SerializeAsString(), resolved->SerializeAsString());
}

// Users read the written spec: .proto names and every default are shown.
TEST(SpecTest, JsonUsesProtoNamesAndShowsDefaults) {
  const std::string compact = JobSpecToJson(Resolve(kMinimal));
  EXPECT_THAT(compact, ::testing::HasSubstr(R"("micro_batch_size":8)"));
  EXPECT_THAT(compact, ::testing::HasSubstr(R"("shuffle":false)"));
  EXPECT_THAT(compact, ::testing::HasSubstr(R"("seed":"0")"));
  EXPECT_THAT(compact, ::testing::HasSubstr(R"("tail":"dynamic")"));
  EXPECT_THAT(compact, ::testing::Not(::testing::HasSubstr("microBatchSize")));
  EXPECT_THAT(compact, ::testing::Not(::testing::HasSubstr("\n")));
  EXPECT_THAT(compact, ::testing::Not(::testing::HasSubstr("max_grad_norm")));  // no clipping
  const std::string pretty = JobSpecToJson(Resolve(kMinimal), /*pretty=*/true);
  EXPECT_THAT(pretty, ::testing::HasSubstr("\n"));
}

// Checkpoints compare hashes: same job, same hash; any change, another hash.
TEST(SpecTest, HashIsStableAndSensitive) {
  const std::string a = JobSpecHash(Resolve(kMinimal));
  EXPECT_THAT(a, ::testing::MatchesRegex("[0-9a-f]{16}"));
  EXPECT_EQ(a, JobSpecHash(Resolve(kMinimal)));
  // Writing a default out does not change the job.
  EXPECT_EQ(a, JobSpecHash(
                   Resolve(R"({"model":{"tiny_gpt":{"n_layer":2}},"batch":{"micro_batch_size":8},)"
                           R"("data":{"text":{"paths":["/usr/share/common-licenses"]}}})")));
  EXPECT_NE(a,
            JobSpecHash(Resolve(R"({"model":{"tiny_gpt":{"n_layer":3}},)"
                                R"("data":{"text":{"paths":["/usr/share/common-licenses"]}}})")));
  EXPECT_NE(a,
            JobSpecHash(Resolve(R"({"seed":1,"model":{"tiny_gpt":{}},)"
                                R"("data":{"text":{"paths":["/usr/share/common-licenses"]}}})")));
}

// The global batch counts every micro-batch of every rank.
TEST(SpecTest, GlobalBatchSamples) {
  EXPECT_EQ(GlobalBatchSamples(Resolve(Text(
                R"("batch":{"micro_batch_size":3,"accumulation_steps":5},"workers":{"count":7})"))),
            3 * 5 * 7);
  // No int32 overflow at the limits.
  EXPECT_EQ(GlobalBatchSamples(
                Resolve(Text(R"("batch":{"micro_batch_size":65536,"accumulation_steps":65536},)"
                             R"("workers":{"count":1024})"))),
            int64_t{65536} * 65536 * 1024);
}

// Catches: the loss scaler's exposed defaults (the coordinator's LossScalerConfig reads them)
// drifting from what the resolver fills in.
TEST(SpecTest, DefaultLossScalerIsWhatResolveFillsIn) {
  v1::LossScaler resolved = Resolve(Text(R"("precision":"fp16")")).loss_scaler();
  EXPECT_TRUE(resolved.enabled());
  EXPECT_FALSE(DefaultLossScaler().has_enabled());  // it follows the precision
  resolved.clear_enabled();
  EXPECT_TRUE(MessageDifferencer::Equals(resolved, DefaultLossScaler()))
      << resolved.DebugString() << DefaultLossScaler().DebugString();
  EXPECT_EQ(DefaultLossScaler().init_scale(), 65536.0);
}

// Catches: a window total that wraps to a negative count (or traps) on a huge stop.epochs, and
// one that counts epochs when only stop.max_updates bounds the job.
TEST(SpecTest, JobTotalWindowsSaturates) {
  EXPECT_EQ(JobTotalWindows(Resolve(Text(R"("stop":{"epochs":3})")), 50), 150);
  EXPECT_EQ(JobTotalWindows(Resolve(Text(R"("stop":{"max_updates":7})")), 50), 0);
  const v1::JobSpec huge = Resolve(Text(R"("stop":{"epochs":"9223372036854775807"})"));
  EXPECT_EQ(JobTotalWindows(huge, 1), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(JobTotalWindows(huge, 2), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(JobTotalWindows(Resolve(Text(R"("stop":{"epochs":"4611686018427387904"})")), 3),
            std::numeric_limits<int64_t>::max());
}

}  // namespace
}  // namespace trainstep
