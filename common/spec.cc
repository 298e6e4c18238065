#include "common/spec.h"

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
#include "common/status_macros.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/util/json_util.h"

namespace trainstep {
namespace {

namespace pb = ::google::protobuf;

// ---------------------------------------------------------------------------------------
// Formatting values for messages.

// The shortest decimal that reads back as `v`, so "got 1.0000001" never prints as "got 1".
std::string FormatDouble(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
  for (int precision = 6; precision < 17; ++precision) {
    std::string s = absl::StrFormat("%.*g", precision, v);
    if (std::strtod(s.c_str(), nullptr) == v) return s;
  }
  return absl::StrFormat("%.17g", v);
}

// A C0 control, DEL, or a C1 control (U+0080..U+009F, encoded C2 80..C2 9F) starts at s[i].
bool IsControlAt(absl::string_view s, size_t i) {
  const unsigned char c = static_cast<unsigned char>(s[i]);
  if (c < 0x20 || c == 0x7F) return true;
  return c == 0xC2 && i + 1 < s.size() && static_cast<unsigned char>(s[i + 1]) >= 0x80 &&
         static_cast<unsigned char>(s[i + 1]) <= 0x9F;
}

// A string as it would be written in the JSON spec, so "\u0007" shows where the bad byte is.
std::string Quote(absl::string_view s) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (IsControlAt(s, i)) {
      const unsigned char code = c == 0xC2 ? static_cast<unsigned char>(s[++i]) : c;
      absl::StrAppend(&out, absl::StrFormat("\\u%04x", code));
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  out.push_back('"');
  return out;
}

// "fp32, bf16, fp16": the values a user may write, without the *_UNSPECIFIED placeholder.
std::string EnumChoices(const pb::EnumDescriptor* e) {
  std::vector<std::string> names;
  for (int i = 0; i < e->value_count(); ++i) {
    if (e->value(i)->number() != 0) names.push_back(e->value(i)->name());
  }
  return absl::StrJoin(names, ", ");
}

std::string FieldNames(const pb::Descriptor* d) {
  std::vector<std::string> names;
  for (int i = 0; i < d->field_count(); ++i) names.push_back(d->field(i)->name());
  return absl::StrJoin(names, ", ");
}

std::string OneofNames(const pb::OneofDescriptor* o) {
  std::vector<std::string> names;
  for (int i = 0; i < o->field_count(); ++i) names.push_back(o->field(i)->name());
  return absl::StrJoin(names, ", ");
}

// ---------------------------------------------------------------------------------------
// Rewriting protobuf's JSON errors.

// The field a protobuf error location ("optimizer.param_groups[1].lr_scale") names, or null.
// `*indexed` tells whether the last segment carried an index (an element, not the list).
const pb::FieldDescriptor* FieldAt(absl::string_view path, bool* indexed) {
  const pb::Descriptor* message = v1::JobSpec::descriptor();
  const pb::FieldDescriptor* field = nullptr;
  for (absl::string_view segment : absl::StrSplit(path, '.')) {
    if (message == nullptr) return nullptr;
    *indexed = false;
    if (size_t bracket = segment.find('['); bracket != absl::string_view::npos) {
      segment = segment.substr(0, bracket);
      *indexed = true;
    }
    const std::string name(segment);
    field = message->FindFieldByName(name);
    if (field == nullptr) field = message->FindFieldByCamelcaseName(name);
    if (field == nullptr) return nullptr;
    message = field->message_type();
  }
  return field;
}

// The message type at a location; the empty location is the spec itself.
const pb::Descriptor* MessageAt(absl::string_view path) {
  if (path.empty()) return v1::JobSpec::descriptor();
  bool indexed = false;
  const pb::FieldDescriptor* field = FieldAt(path, &indexed);
  return field == nullptr ? nullptr : field->message_type();
}

// What a field accepts, in words: "an integer", "a number", "one of fp32, bf16, fp16"...
std::string Expected(const pb::FieldDescriptor* field, bool element) {
  std::string one;
  std::string many;
  switch (field->cpp_type()) {
    case pb::FieldDescriptor::CPPTYPE_INT32:
    case pb::FieldDescriptor::CPPTYPE_INT64:
    case pb::FieldDescriptor::CPPTYPE_UINT32:
    case pb::FieldDescriptor::CPPTYPE_UINT64:
      one = "an integer";
      many = "integers";
      break;
    case pb::FieldDescriptor::CPPTYPE_DOUBLE:
    case pb::FieldDescriptor::CPPTYPE_FLOAT:
      one = "a number";
      many = "numbers";
      break;
    case pb::FieldDescriptor::CPPTYPE_BOOL:
      one = "true or false";
      many = "booleans";
      break;
    case pb::FieldDescriptor::CPPTYPE_STRING:
      one = "a string";
      many = "strings";
      break;
    case pb::FieldDescriptor::CPPTYPE_ENUM:
      one = absl::StrCat("one of ", EnumChoices(field->enum_type()));
      many = absl::StrCat("values among ", EnumChoices(field->enum_type()));
      break;
    case pb::FieldDescriptor::CPPTYPE_MESSAGE:
      one = "an object";
      many = "objects";
      break;
  }
  if (field->is_repeated() && !element) return absl::StrCat("a list of ", many);
  return one;
}

// For an integral value out of a field's range: "from 1 to 2147483647"-style bounds.
std::string IntegerBounds(const pb::FieldDescriptor* field) {
  switch (field->cpp_type()) {
    case pb::FieldDescriptor::CPPTYPE_INT32:
      return absl::StrCat(std::numeric_limits<int32_t>::min(), " to ",
                          std::numeric_limits<int32_t>::max());
    case pb::FieldDescriptor::CPPTYPE_INT64:
      return absl::StrCat(std::numeric_limits<int64_t>::min(), " to ",
                          std::numeric_limits<int64_t>::max());
    case pb::FieldDescriptor::CPPTYPE_UINT32:
      return absl::StrCat("0 to ", std::numeric_limits<uint32_t>::max());
    case pb::FieldDescriptor::CPPTYPE_UINT64:
      return absl::StrCat("0 to ", std::numeric_limits<uint64_t>::max());
    default:
      return "";
  }
}

// 1-based line and column (in characters, not bytes) of a byte offset.
std::pair<int, int> LineColumn(absl::string_view text, size_t offset) {
  offset = std::min(offset, text.size());
  int line = 1;
  int column = 1;
  for (size_t i = 0; i < offset; ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c == '\n') {
      ++line;
      column = 1;
    } else if ((c & 0xC0) != 0x80) {  // not a UTF-8 continuation byte
      ++column;
    }
  }
  return {line, column};
}

// Protobuf's tokenizer reports "<reason>\n<up to 20 chars either side>\n<spaces>^" and no
// offset; find the excerpt in the input to recover the offset.
absl::Status SyntaxError(absl::string_view json, absl::string_view message) {
  const size_t first_newline = message.find('\n');
  const size_t last_newline = message.rfind('\n');
  const size_t caret = message.find('^', last_newline);
  if (last_newline == first_newline || caret == absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat("spec is not valid JSON: ", message));
  }
  const absl::string_view reason = message.substr(0, first_newline);
  // The excerpt may itself span lines; the marker is always the last line.
  const absl::string_view excerpt =
      message.substr(first_newline + 1, last_newline - first_newline - 1);
  const size_t column_in_excerpt = caret - last_newline - 1;
  size_t offset = json.size();  // an empty excerpt means the input ran out
  if (!excerpt.empty()) {
    // The excerpt starts 20 characters before the error, or at the start of the input
    // (protobuf's JsonStreamParser::ReportFailure); prefer the occurrence that fits that.
    constexpr size_t kContext = 20;
    size_t first_match = absl::string_view::npos;
    size_t exact_match = absl::string_view::npos;
    for (size_t at = json.find(excerpt); at != absl::string_view::npos;
         at = json.find(excerpt, at + 1)) {
      const size_t error_at = at + column_in_excerpt;
      if (first_match == absl::string_view::npos) first_match = error_at;
      if (error_at - std::min(error_at, kContext) == at) {
        exact_match = error_at;
        break;
      }
    }
    offset = exact_match != absl::string_view::npos ? exact_match : first_match;
    if (offset == absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat("spec is not valid JSON: ", message));
    }
  }
  const auto [line, column] = LineColumn(json, offset);
  return absl::InvalidArgumentError(
      absl::StrCat("spec is not valid JSON at line ", line, ", column ", column, ": ", reason));
}

// What a JSON document that is not an object holds, in words.
std::string DescribeJsonValue(absl::string_view json) {
  json = absl::StripLeadingAsciiWhitespace(json);
  if (json.empty()) return "nothing";
  switch (json.front()) {
    case '[':
      return "a list";
    case '"':
    case '\'':
      return "a string";
    case 'n':
      return "null";
    case 't':
    case 'f':
      return std::string(json.substr(0, json.front() == 't' ? 4 : 5));
    default:
      return "a number";
  }
}

std::string Join(absl::string_view location, absl::string_view name) {
  return location.empty() ? std::string(name) : absl::StrCat(location, ".", name);
}

// Protobuf's tokenizer errors end in a line that holds only a caret under the error; its
// field errors are one line (unless a field name holds a newline).
bool IsSyntaxError(absl::string_view message) {
  const size_t last_newline = message.rfind('\n');
  if (last_newline == absl::string_view::npos || absl::StartsWith(message, "(")) return false;
  const absl::string_view marker = message.substr(last_newline + 1);
  return absl::EndsWith(marker, "^") && marker.find_first_not_of(' ') == marker.size() - 1;
}

// An unknown field name as the user typed it; quoted when it holds more than a name can.
std::string FieldNameForMessage(absl::string_view name) {
  const bool plain = !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
    return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_';
  });
  return plain ? std::string(name) : Quote(name);
}

// Turns protobuf's JSON parser errors into "<field.path>: <what to do>".
absl::Status RewriteParseError(absl::string_view json, absl::string_view message) {
  if (IsSyntaxError(message)) return SyntaxError(json, message);
  if (absl::EndsWith(message, "Root element must be a message.")) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec must be a JSON object, got ", DescribeJsonValue(json)));
  }
  // "(batch.tail): invalid value ...", "(batch) micro_batch_sizee: ...", "name: ...".
  absl::string_view location;
  absl::string_view rest = message;
  if (absl::StartsWith(message, "(")) {
    const size_t close = message.find(')');
    if (close != absl::string_view::npos) {
      location = message.substr(1, close - 1);
      rest = absl::StripLeadingAsciiWhitespace(message.substr(close + 1));
    }
  }
  const auto generic = [&] {
    return absl::InvalidArgumentError(
        absl::StrCat(location.empty() ? "spec" : location, ": ",
                     absl::StripLeadingAsciiWhitespace(absl::StripPrefix(rest, ":"))));
  };

  constexpr absl::string_view kUnknown = ": Cannot find field.";
  if (absl::EndsWith(rest, kUnknown)) {
    const absl::string_view name = rest.substr(0, rest.size() - kUnknown.size());
    const pb::Descriptor* parent = MessageAt(location);
    if (parent == nullptr) return generic();
    return absl::InvalidArgumentError(
        absl::StrCat(Join(location, FieldNameForMessage(name)), ": unknown field; ",
                     location.empty() ? "the spec" : location, " accepts: ", FieldNames(parent)));
  }

  constexpr absl::string_view kNotList = ": Proto field is not repeating, cannot start list.";
  if (absl::EndsWith(rest, kNotList)) {
    const std::string path = Join(location, rest.substr(0, rest.size() - kNotList.size()));
    bool indexed = false;
    const pb::FieldDescriptor* field = FieldAt(path, &indexed);
    if (field == nullptr) return generic();
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": expected ", Expected(field, indexed), ", got a list"));
  }

  constexpr absl::string_view kInvalid = ": invalid value ";
  if (!absl::StartsWith(rest, kInvalid)) return generic();
  const absl::string_view detail = rest.substr(kInvalid.size());

  constexpr absl::string_view kObjectOnScalar = "Starting an object on a scalar field for type ";
  if (absl::StartsWith(detail, kObjectOnScalar)) {
    const std::string path = Join(location, detail.substr(kObjectOnScalar.size()));
    bool indexed = false;
    const pb::FieldDescriptor* field = FieldAt(path, &indexed);
    if (field == nullptr) return generic();
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": expected ", Expected(field, /*element=*/true), ", got an object"));
  }

  // "oneof field 'kind' is already set. Cannot set 'mlp' for type oneof"
  if (absl::StartsWith(detail, "oneof field '")) {
    const std::vector<absl::string_view> quoted = absl::StrSplit(detail, '\'');
    const pb::Descriptor* parent = MessageAt(location);
    if (quoted.size() < 4 || parent == nullptr) return generic();
    const pb::OneofDescriptor* oneof = parent->FindOneofByName(std::string(quoted[1]));
    const std::string second(quoted[3]);
    const pb::FieldDescriptor* field = parent->FindFieldByName(second);
    if (field == nullptr) field = parent->FindFieldByCamelcaseName(second);
    if (oneof == nullptr || field == nullptr) return generic();
    if (oneof->field_count() == 1) {  // the hidden oneof of a proto3 `optional` field
      return absl::InvalidArgumentError(
          absl::StrCat(Join(location, field->name()), ": given more than once (perhaps as both ",
                       field->name(), " and ", field->json_name(), "); give it once"));
    }
    return absl::InvalidArgumentError(absl::StrCat(location.empty() ? "spec" : location,
                                                   ": give only one of ", OneofNames(oneof),
                                                   ", got ", field->name(), " and another"));
  }

  // "<value> for type <type>": a value of the wrong type, or an unknown enum name.
  const size_t for_type = detail.rfind(" for type ");
  bool indexed = false;
  const pb::FieldDescriptor* field = FieldAt(location, &indexed);
  if (for_type == absl::string_view::npos || field == nullptr) return generic();
  absl::string_view value = detail.substr(0, for_type);
  // Protobuf quotes a string value without escaping it; escape it as the spec would.
  std::string requoted;
  if (value.size() >= 2 && value.front() == '"' && value.back() == '"') {
    requoted = Quote(value.substr(1, value.size() - 2));
    value = requoted;
  }
  if (field->cpp_type() == pb::FieldDescriptor::CPPTYPE_ENUM && absl::StartsWith(value, "\"")) {
    return absl::InvalidArgumentError(
        absl::StrCat(location, ": ", value, " is not one of ", EnumChoices(field->enum_type())));
  }
  const std::string bounds = IntegerBounds(field);
  double number = 0;
  if (!bounds.empty() && absl::SimpleAtod(value, &number) && std::isfinite(number) &&
      std::floor(number) == number) {
    return absl::InvalidArgumentError(
        absl::StrCat(location, ": expected an integer from ", bounds, ", got ", value));
  }
  return absl::InvalidArgumentError(
      absl::StrCat(location, ": expected ", Expected(field, indexed), ", got ", value));
}

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

constexpr int32_t kDefaultTextSeqLen = 128;
constexpr int32_t kDefaultVocabSize = 256;  // bytes
constexpr int32_t kDefaultInFeatures = 8;

// ---------------------------------------------------------------------------------------
// One function per top-level field, called in the order of spec.proto. Each reads the
// user's spec `in` for cross-field defaults and fills its part of `out`.

absl::Status ResolveName(v1::JobSpec& out) {
  if (out.name().empty()) out.set_name("job");
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
      if (data.source_case() != v1::Data::SOURCE_NOT_SET && !token_data) {
        return Invalid(absl::StrCat("model.", model.has_tiny_gpt() ? "tiny_gpt" : "torchscript",
                                    " needs ", kTokenSources, ", got ", DataKind(data)));
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
    if (!t.has_n_layer()) t.set_n_layer(2);
    RETURN_IF_ERROR(IntInRange("model.tiny_gpt.n_layer", t.n_layer(), 1, 64));
    if (!t.has_n_head()) t.set_n_head(2);
    RETURN_IF_ERROR(IntInRange("model.tiny_gpt.n_head", t.n_head(), 1, 64));
    if (!t.has_d_model()) t.set_d_model(64);
    RETURN_IF_ERROR(IntInRange("model.tiny_gpt.d_model", t.d_model(), 1, 8192));
    if (t.d_model() % t.n_head() != 0) {
      return Invalid(
          absl::StrCat("model.tiny_gpt.d_model must be divisible by model.tiny_gpt.n_head, got ",
                       t.d_model(), " and ", t.n_head()));
    }
    if (t.has_seq_len()) {
      RETURN_IF_ERROR(IntInRange("model.tiny_gpt.seq_len", t.seq_len(), 2, 65536));
    } else if (data.has_text()) {
      // Checked where data.text.seq_len is resolved.
      t.set_seq_len(data.text().has_seq_len() ? data.text().seq_len() : kDefaultTextSeqLen);
    } else if (data.has_tokens()) {
      // A tokens sample is seq_len + 1 tokens; checked where data.tokens.seq_len is resolved.
      const int64_t tokens =
          data.tokens().has_seq_len() ? data.tokens().seq_len() : kDefaultTextSeqLen;
      t.set_seq_len(static_cast<int32_t>(std::min<int64_t>(tokens + 1, 65536)));
    } else {
      t.set_seq_len(256);
    }
    if (!t.has_vocab_size()) t.set_vocab_size(kDefaultVocabSize);
    RETURN_IF_ERROR(IntInRange("model.tiny_gpt.vocab_size", t.vocab_size(), 2, 1000000));
  } else if (model.has_mlp()) {
    v1::Mlp& m = *model.mutable_mlp();
    const v1::SyntheticRegression& regression = data.synthetic_regression();
    if (m.has_in_features()) {
      RETURN_IF_ERROR(IntInRange("model.mlp.in_features", m.in_features(), 1, 65536));
      if (regression.has_in_features() && regression.in_features() != m.in_features()) {
        return Invalid(absl::StrCat(
            "model.mlp.in_features must equal data.synthetic_regression.in_features, got ",
            m.in_features(), " and ", regression.in_features()));
      }
    } else {
      // Checked where data.synthetic_regression.in_features is resolved.
      m.set_in_features(regression.has_in_features() ? regression.in_features()
                                                     : kDefaultInFeatures);
    }
    if (!m.has_hidden()) m.set_hidden(32);
    RETURN_IF_ERROR(IntInRange("model.mlp.hidden", m.hidden(), 1, 65536));
    if (!m.has_out_features()) m.set_out_features(1);
    RETURN_IF_ERROR(IntInRange("model.mlp.out_features", m.out_features(), 1, 65536));
  } else {
    v1::TorchScript& ts = *model.mutable_torchscript();
    if (ts.path().empty()) {
      return Invalid(
          "model.torchscript.path is required: the TorchScript file whose forward(input_ids) "
          "returns logits, got \"\"");
    }
    if (!ts.has_vocab_size()) ts.set_vocab_size(kDefaultVocabSize);
    RETURN_IF_ERROR(IntInRange("model.torchscript.vocab_size", ts.vocab_size(), 2, 1000000));
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
    tokens.set_seq_len(model_seq_len ? std::max(1, std::min(kDefaultTextSeqLen, gpt.seq_len() - 1))
                                     : kDefaultTextSeqLen);
  }
  RETURN_IF_ERROR(IntInRange(absl::StrCat(at, ".seq_len"), tokens.seq_len(), 1, 65535));
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
        text.set_seq_len(model_seq_len ? std::min(kDefaultTextSeqLen, gpt.seq_len())
                                       : kDefaultTextSeqLen);
      }
      RETURN_IF_ERROR(IntInRange(absl::StrCat(path, ".text.seq_len"), text.seq_len(), 2, 65536));
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
      if (!r.has_samples()) r.set_samples(1024);
      RETURN_IF_ERROR(IntInRange(absl::StrCat(path, ".synthetic_regression.samples"), r.samples(),
                                 1, 100000000));
      if (!r.has_in_features()) {
        const bool mlp_in = model.has_mlp() && model.mlp().has_in_features();
        r.set_in_features(mlp_in ? model.mlp().in_features() : kDefaultInFeatures);
      }
      RETURN_IF_ERROR(IntInRange(absl::StrCat(path, ".synthetic_regression.in_features"),
                                 r.in_features(), 1, 65536));
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

absl::Status ResolveBatch(v1::JobSpec& out) {
  v1::Batch& batch = *out.mutable_batch();
  if (!batch.has_micro_batch_size()) batch.set_micro_batch_size(8);
  RETURN_IF_ERROR(IntInRange("batch.micro_batch_size", batch.micro_batch_size(), 1, 65536));
  if (!batch.has_accumulation_steps()) batch.set_accumulation_steps(1);
  RETURN_IF_ERROR(IntInRange("batch.accumulation_steps", batch.accumulation_steps(), 1, 65536));
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
    if (!sgd.has_lr()) sgd.set_lr(0.01);
    RETURN_IF_ERROR(DoubleInRange("optimizer.sgd.lr", sgd.lr(), 0, End::kOpen));
    if (!sgd.has_momentum()) sgd.set_momentum(0);
    RETURN_IF_ERROR(
        DoubleInRange("optimizer.sgd.momentum", sgd.momentum(), 0, End::kClosed, 1, End::kOpen));
    if (!sgd.has_weight_decay()) sgd.set_weight_decay(0);
    RETURN_IF_ERROR(
        DoubleInRange("optimizer.sgd.weight_decay", sgd.weight_decay(), 0, End::kClosed));
  } else {
    v1::AdamW& adam = *opt.mutable_adamw();
    if (!adam.has_lr()) adam.set_lr(1e-3);
    RETURN_IF_ERROR(DoubleInRange("optimizer.adamw.lr", adam.lr(), 0, End::kOpen));
    if (!adam.has_beta1()) adam.set_beta1(0.9);
    RETURN_IF_ERROR(
        DoubleInRange("optimizer.adamw.beta1", adam.beta1(), 0, End::kClosed, 1, End::kOpen));
    if (!adam.has_beta2()) adam.set_beta2(0.999);
    RETURN_IF_ERROR(
        DoubleInRange("optimizer.adamw.beta2", adam.beta2(), 0, End::kClosed, 1, End::kOpen));
    if (!adam.has_eps()) adam.set_eps(1e-8);
    RETURN_IF_ERROR(DoubleInRange("optimizer.adamw.eps", adam.eps(), 0, End::kOpen));
    if (!adam.has_weight_decay()) adam.set_weight_decay(0.01);
    RETURN_IF_ERROR(
        DoubleInRange("optimizer.adamw.weight_decay", adam.weight_decay(), 0, End::kClosed));
  }

  pb::RepeatedPtrField<std::string> group_prefixes;
  for (int i = 0; i < opt.param_groups_size(); ++i) {
    v1::ParamGroup& group = *opt.mutable_param_groups(i);
    *group_prefixes.Add() = group.prefix();
    if (!group.has_lr_scale()) group.set_lr_scale(1.0);
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
  if (!decay->has_warmup_updates()) decay->set_warmup_updates(0);
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
  if (!decay->has_min_lr_ratio()) decay->set_min_lr_ratio(0);
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
  if (!s.has_init_scale()) s.set_init_scale(65536.0);
  RETURN_IF_ERROR(DoubleInRange("loss_scaler.init_scale", s.init_scale(), 0, End::kOpen));
  if (!s.has_growth_factor()) s.set_growth_factor(2.0);
  RETURN_IF_ERROR(DoubleInRange("loss_scaler.growth_factor", s.growth_factor(), 1, End::kOpen));
  if (!s.has_backoff_factor()) s.set_backoff_factor(0.5);
  RETURN_IF_ERROR(DoubleInRange("loss_scaler.backoff_factor", s.backoff_factor(), 0, End::kOpen, 1,
                                End::kOpen));
  if (!s.has_growth_interval()) s.set_growth_interval(2000);
  RETURN_IF_ERROR(IntAtLeast("loss_scaler.growth_interval", s.growth_interval(), 1));
  if (!s.has_hysteresis()) s.set_hysteresis(1);
  RETURN_IF_ERROR(IntAtLeast("loss_scaler.hysteresis", s.hysteresis(), 1));
  if (!s.has_min_scale()) s.set_min_scale(0);
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
  if (!stop.has_max_updates() && !stop.has_epochs()) stop.set_epochs(1);
  return absl::OkStatus();
}

absl::Status ResolveCheckpoint(v1::JobSpec& out) {
  v1::Checkpoint& c = *out.mutable_checkpoint();
  if (!c.has_every_updates()) c.set_every_updates(100);
  RETURN_IF_ERROR(IntAtLeast("checkpoint.every_updates", c.every_updates(), 1));
  if (!c.has_keep_last()) c.set_keep_last(3);
  return IntAtLeast("checkpoint.keep_last", c.keep_last(), 0);
}

absl::Status ResolveWorkers(v1::JobSpec& out) {
  v1::Workers& w = *out.mutable_workers();
  if (!w.has_count()) w.set_count(1);
  return IntInRange("workers.count", w.count(), 1, 1024);
}

absl::Status ResolveDebug(v1::JobSpec& out) {
  const v1::Debug& debug = *out.mutable_debug();
  std::map<int64_t, int> seen;
  for (int i = 0; i < debug.nonfinite_grad_windows_size(); ++i) {
    const int64_t window = debug.nonfinite_grad_windows(i);
    const std::string path = absl::StrCat("debug.nonfinite_grad_windows[", i, "]");
    RETURN_IF_ERROR(IntAtLeast(path, window, 1));
    auto [it, inserted] = seen.emplace(window, i);
    if (!inserted) {
      return Invalid(absl::StrCat(path, " must be unique, got ", window,
                                  " (also at debug.nonfinite_grad_windows[", it->second, "])"));
    }
  }
  return absl::OkStatus();
}

// FNV-1a, 64 bits: simple, and the same on every machine and in every process.
uint64_t Fnv1a64(absl::string_view bytes) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return h;
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
  if (!eval.has_every_updates()) eval.set_every_updates(100);
  RETURN_IF_ERROR(IntInRange("eval.every_updates", eval.every_updates(), 1, int64_t{1} << 40));
  if (eval.has_max_batches()) {
    RETURN_IF_ERROR(IntInRange("eval.max_batches", eval.max_batches(), 1, int64_t{1} << 40));
  }
  return absl::OkStatus();
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
  return spec;
}

absl::StatusOr<v1::JobSpec> ResolveJobSpec(const v1::JobSpec& spec) {
  v1::JobSpec out = spec;
  // The order of the fields in spec.proto, so the first error is always the same one.
  RETURN_IF_ERROR(ResolveName(out));
  if (!out.has_seed()) out.set_seed(0);
  RETURN_IF_ERROR(ResolveModel(spec, out));
  RETURN_IF_ERROR(ResolveData(spec, out));
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
  RETURN_IF_ERROR(ResolveDebug(out));
  RETURN_IF_ERROR(ResolveEval(out));
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

int64_t GlobalBatchSamples(const v1::JobSpec& resolved) {
  return int64_t{resolved.batch().micro_batch_size()} * resolved.batch().accumulation_steps() *
         resolved.workers().count();
}

bool IsTokenLevel(const v1::JobSpec& resolved) {
  return resolved.data().has_text() || resolved.data().has_jsonl() || resolved.data().has_tokens();
}

int64_t ModelVocabSize(const v1::JobSpec& resolved) {
  const v1::Model& m = resolved.model();
  // A spec resolved before the field existed (journaled by an older coordinator) means bytes.
  if (m.has_tiny_gpt()) {
    return m.tiny_gpt().has_vocab_size() ? m.tiny_gpt().vocab_size() : kDefaultVocabSize;
  }
  if (m.has_torchscript()) {
    return m.torchscript().has_vocab_size() ? m.torchscript().vocab_size() : kDefaultVocabSize;
  }
  return 0;
}

std::string ModelVocabSizeField(const v1::JobSpec& resolved) {
  if (resolved.model().has_tiny_gpt()) return "model.tiny_gpt.vocab_size";
  if (resolved.model().has_torchscript()) return "model.torchscript.vocab_size";
  return "";
}

}  // namespace trainstep
