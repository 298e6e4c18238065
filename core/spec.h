// The job spec (trainstep.v1.JobSpec): the one place that parses it from JSON, validates it
// and fills in its defaults. Every other module reads only resolved specs, so defaults and
// rules live here and nowhere else. Pure functions: no files, no clock, thread-safe.
#ifndef TRAINSTEP_CORE_SPEC_H_
#define TRAINSTEP_CORE_SPEC_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "trainstep/v1/spec.pb.h"

namespace trainstep {

// Parses protobuf JSON. Field names as in the .proto ("micro_batch_size"); lowerCamelCase is
// accepted too, as protobuf does. A leading UTF-8 byte-order mark is ignored.
// Errors are INVALID_ARGUMENT and name the field path, e.g.
//   workers.cont: unknown field; workers accepts: count
//   precision: "fp8" is not one of fp32, bf16, fp16
//   batch.micro_batch_size: expected an integer, got 4.5
//   spec is not valid JSON at line 3, column 21: Unexpected token.
// Parsing does not validate values: an unknown enum number or a NaN parses, and is
// rejected by ResolveJobSpec. A -0 reads as 0, so JobSpecToJson's output reads back equal.
absl::StatusOr<v1::JobSpec> ParseJobSpecJson(std::string_view json);

// Validates every field and returns a copy with every default filled in: every `optional`
// field set (except clip.max_grad_norm, stop.max_updates, and stop.epochs when max_updates is
// set, eval.max_batches: there "unset" means "no limit"), every enum not *_UNSPECIFIED, every
// oneof chosen, every sub-message present (but `eval`: absent means no evaluation). The first
// broken rule, in the order of the fields in spec.proto, is returned as INVALID_ARGUMENT
// "<field.path> <rule>, got <value>", e.g. "batch.accumulation_steps must be ≥ 1, got 0".
// Idempotent: resolving a resolved spec returns it unchanged. Checks no files: paths are the
// worker's business.
absl::StatusOr<v1::JobSpec> ResolveJobSpec(const v1::JobSpec& spec);

// stragglers.score_windows's default, also for the specs of jobs journaled before the field.
inline constexpr int32_t kDefaultScoreWindows = 20;

// ParseJobSpecJson, then ResolveJobSpec.
absl::StatusOr<v1::JobSpec> ParseAndResolveJobSpec(std::string_view json);

// Protobuf JSON with the .proto field names and every field with a value or a default
// shown (64-bit integers are strings, as protobuf's mapping says). `pretty` indents.
// ParseJobSpecJson reads it back to an equal message.
std::string JobSpecToJson(const v1::JobSpec& spec, bool pretty = false);

// 16 lowercase hex digits: FNV-1a 64 of the deterministic binary serialization. Stable
// across processes and machines; meant for resolved specs (checkpoints' meta.json), so
// that two specs that mean the same job hash the same.
std::string JobSpecHash(const v1::JobSpec& resolved);

// The loss_scaler fields ResolveJobSpec fills in when a spec leaves them out (PyTorch
// GradScaler's defaults, hysteresis 1, no floor): every field set but `enabled`, whose default
// follows the precision.
const v1::LossScaler& DefaultLossScaler();

// Samples per optimizer update over all ranks: micro_batch_size × accumulation_steps ×
// workers.count.
int64_t GlobalBatchSamples(const v1::JobSpec& resolved);

// Windows of the whole job when stop.epochs bounds it: windows_per_epoch × stop.epochs (0
// when stop.epochs is unset). Saturates at INT64_MAX, so a huge stop.epochs cannot wrap to a
// negative count; INT64_MAX reads as "beyond any horizon".
int64_t JobTotalWindows(const v1::JobSpec& resolved, int64_t windows_per_epoch);

// True when the data is token-level (data.text, data.jsonl or data.tokens): losses normalise
// by tokens.
bool IsTokenLevel(const v1::JobSpec& resolved);

// The token ids a language model accepts: model.tiny_gpt.vocab_size, or for model.torchscript
// the model's own vocabulary, which the worker records in model.torchscript.vocab_size once
// the model is loaded (RecordModelVocabulary; 0 before, and for mlp). The one place the
// model's vocabulary is read from a spec.
int64_t ModelVocabSize(const v1::JobSpec& resolved);
// What says so, for messages: "model.tiny_gpt.vocab_size", "the model /m.pt's vocab_size"
// ("" for mlp).
std::string ModelVocabSource(const v1::JobSpec& resolved);

}  // namespace trainstep

#endif  // TRAINSTEP_CORE_SPEC_H_
