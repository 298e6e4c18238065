#include "worker/checkpoint/checkpoint_meta.h"

#include <google/protobuf/struct.pb.h>

#include <charconv>
#include <cmath>
#include <limits>
#include <tuple>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/log.h"
#include "common/safetensors_format.h"
#include "common/status_macros.h"

namespace trainstep::ckpt {
namespace {

using google::protobuf::Value;

// Integers a JSON double holds exactly; beyond them meta.json uses decimal strings.
constexpr int64_t kMaxExactJsonInt = (int64_t{1} << 53) - 1;

struct IntField {
  const char* name;
  int64_t CheckpointMeta::*member;
};
// meta.json's integer fields. Strings and loss_scale are handled by name.
constexpr IntField kIntFields[] = {
    {"checkpoint_id", &CheckpointMeta::checkpoint_id},
    {"optimizer_update_id", &CheckpointMeta::optimizer_update_id},
    {"scheduler_step", &CheckpointMeta::scheduler_step},
    {"window_id", &CheckpointMeta::window_id},
    {"epoch", &CheckpointMeta::epoch},
    {"cumulative_tokens", &CheckpointMeta::cumulative_tokens},
    {"scaler_growth_tracker", &CheckpointMeta::scaler_growth_tracker},
    {"next_window_id", &CheckpointMeta::next_window_id},
    {"written_unix_ms", &CheckpointMeta::written_unix_ms},
};

std::string IntJson(int64_t v) {
  if (v >= -kMaxExactJsonInt && v <= kMaxExactJsonInt) return absl::StrCat(v);
  return absl::StrCat("\"", v, "\"");
}

// Shortest text that parses back to the same double.
std::string DoubleJson(double v) {
  // protobuf's parser reads "-0" as an integer, losing the sign; "-0.0" keeps it.
  if (v == 0 && std::signbit(v)) return "-0.0";
  char buf[64];
  const std::to_chars_result r = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, r.ptr);
}

absl::Status MetaError(absl::string_view field, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat("meta.json field \"", field, "\" ", problem));
}

absl::StatusOr<const Value*> MetaField(const google::protobuf::Struct& s, const char* name) {
  auto it = s.fields().find(name);
  if (it == s.fields().end()) return MetaError(name, "is missing");
  return &it->second;
}

absl::StatusOr<int64_t> MetaInt(const google::protobuf::Struct& s, const char* name) {
  ASSIGN_OR_RETURN(const Value* v, MetaField(s, name));
  if (v->kind_case() == Value::kNumberValue) {
    const double d = v->number_value();
    // Beyond 2^53 the parser may already have rounded: such values are written as strings.
    if (std::abs(d) <= static_cast<double>(kMaxExactJsonInt) && d == std::floor(d)) {
      return static_cast<int64_t>(d);
    }
    return MetaError(name, absl::StrCat("is ", d, ", not an integer within +-(2^53-1)"));
  }
  int64_t out;
  if (v->kind_case() == Value::kStringValue && absl::SimpleAtoi(v->string_value(), &out)) {
    return out;
  }
  return MetaError(name, "is not an integer");
}

// A file of the checkpoint directory: a plain name, never a path or a dot-file.
bool IsPlainFileName(absl::string_view name) {
  return !name.empty() && name[0] != '.' && name.find('/') == absl::string_view::npos &&
         internal::IsValidUtf8(name);
}

std::string HexDigest(uint64_t v) { return absl::StrFormat("%016x", v); }

absl::StatusOr<std::map<std::string, uint64_t>> MetaDigests(const Value& v) {
  if (v.kind_case() != Value::kStructValue) return MetaError("xxh64", "is not an object");
  std::map<std::string, uint64_t> out;
  for (const auto& [name, digest] : v.struct_value().fields()) {
    uint64_t d = 0;
    if (!IsPlainFileName(name)) {
      return MetaError("xxh64", absl::StrCat("names \"", absl::CHexEscape(name),
                                             "\", not a file of the checkpoint"));
    }
    if (digest.kind_case() != Value::kStringValue || digest.string_value().size() != 16 ||
        !absl::SimpleHexAtoi(digest.string_value(), &d) || HexDigest(d) != digest.string_value()) {
      return MetaError("xxh64", absl::StrCat("of ", name, " is not 16 lowercase hex digits"));
    }
    out.emplace(name, d);
  }
  return out;
}

absl::StatusOr<std::string> MetaString(const google::protobuf::Struct& s, const char* name) {
  ASSIGN_OR_RETURN(const Value* v, MetaField(s, name));
  if (v->kind_case() != Value::kStringValue) return MetaError(name, "is not a string");
  return v->string_value();
}

}  // namespace

bool operator==(const CheckpointMeta& a, const CheckpointMeta& b) {
  const auto tie = [](const CheckpointMeta& m) {
    return std::tie(m.job_id, m.checkpoint_id, m.optimizer_update_id, m.scheduler_step, m.window_id,
                    m.epoch, m.cumulative_tokens, m.loss_scale, m.scaler_growth_tracker,
                    m.spec_hash, m.next_window_id, m.written_unix_ms, m.eval_update_id,
                    m.file_xxh64);
  };
  // NaN evaluations compare equal: meta.json writes both as null.
  const bool same_eval = a.eval_loss.has_value() == b.eval_loss.has_value() &&
                         (!a.eval_loss.has_value() || *a.eval_loss == *b.eval_loss ||
                          (std::isnan(*a.eval_loss) && std::isnan(*b.eval_loss)));
  return tie(a) == tie(b) && same_eval;
}

absl::StatusOr<std::string> CheckpointMetaToJson(const CheckpointMeta& m) {
  if (!std::isfinite(m.loss_scale)) {
    return MetaError("loss_scale",
                     absl::StrCat("is ", m.loss_scale, "; JSON needs a finite number"));
  }
  if (!internal::IsValidUtf8(m.job_id)) return MetaError("job_id", "is not valid UTF-8");
  if (!internal::IsValidUtf8(m.spec_hash)) return MetaError("spec_hash", "is not valid UTF-8");
  std::string digests;
  for (const auto& [name, digest] : m.file_xxh64) {
    if (!IsPlainFileName(name)) {
      return MetaError("xxh64", absl::StrCat("names \"", absl::CHexEscape(name),
                                             "\", not a file of the checkpoint"));
    }
    absl::StrAppend(&digests, digests.empty() ? "" : ",", "\n    ", JsonQuote(name), ": \"",
                    HexDigest(digest), "\"");
  }
  return absl::StrCat(
      "{\n", "  \"job_id\": ", JsonQuote(m.job_id), ",\n",
      "  \"checkpoint_id\": ", IntJson(m.checkpoint_id), ",\n",
      "  \"optimizer_update_id\": ", IntJson(m.optimizer_update_id), ",\n",
      "  \"scheduler_step\": ", IntJson(m.scheduler_step), ",\n",
      "  \"window_id\": ", IntJson(m.window_id), ",\n", "  \"epoch\": ", IntJson(m.epoch), ",\n",
      "  \"cumulative_tokens\": ", IntJson(m.cumulative_tokens), ",\n",
      "  \"loss_scale\": ", DoubleJson(m.loss_scale), ",\n",
      "  \"scaler_growth_tracker\": ", IntJson(m.scaler_growth_tracker), ",\n",
      "  \"spec_hash\": ", JsonQuote(m.spec_hash), ",\n",
      "  \"next_window_id\": ", IntJson(m.next_window_id), ",\n",
      "  \"written_unix_ms\": ", IntJson(m.written_unix_ms),
      m.eval_loss.has_value() ? absl::StrCat(",\n  \"eval_loss\": ",
                                             std::isfinite(*m.eval_loss) ? DoubleJson(*m.eval_loss)
                                                                         : std::string("null"),
                                             ",\n  \"eval_update_id\": ", IntJson(m.eval_update_id))
                              : std::string(),
      digests.empty() ? std::string() : absl::StrCat(",\n  \"xxh64\": {", digests, "\n  }"), "\n",
      "}\n");
}

absl::StatusOr<CheckpointMeta> CheckpointMetaFromJson(absl::string_view json) {
  ASSIGN_OR_RETURN(const google::protobuf::Struct s,
                   internal::ParseJsonObject(json, /*max_depth=*/2, "meta.json"));
  // Unknown keys are ignored, so a newer writer may add fields.
  CheckpointMeta m;
  ASSIGN_OR_RETURN(m.job_id, MetaString(s, "job_id"));
  ASSIGN_OR_RETURN(m.spec_hash, MetaString(s, "spec_hash"));
  for (const IntField& f : kIntFields) {
    ASSIGN_OR_RETURN(m.*f.member, MetaInt(s, f.name));
  }
  ASSIGN_OR_RETURN(const Value* scale, MetaField(s, "loss_scale"));
  if (scale->kind_case() != Value::kNumberValue) return MetaError("loss_scale", "is not a number");
  m.loss_scale = scale->number_value();
  // Optional (written only after an evaluation): absent in checkpoints of jobs without eval.
  if (auto it = s.fields().find("eval_loss"); it != s.fields().end()) {
    if (it->second.kind_case() == Value::kNumberValue) {
      m.eval_loss = it->second.number_value();
    } else if (it->second.kind_case() == Value::kNullValue) {
      m.eval_loss = std::numeric_limits<double>::quiet_NaN();
    } else {
      return MetaError("eval_loss", "is not a number or null");
    }
    ASSIGN_OR_RETURN(m.eval_update_id, MetaInt(s, "eval_update_id"));
  }
  // Optional: checkpoints written before digests existed are read without them.
  if (auto it = s.fields().find("xxh64"); it != s.fields().end()) {
    ASSIGN_OR_RETURN(m.file_xxh64, MetaDigests(it->second));
  }
  return m;
}

}  // namespace trainstep::ckpt
