#include "core/spec_parse_error.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/spec_text.h"
#include "google/protobuf/descriptor.h"
#include "trainstep/v1/spec.pb.h"

namespace trainstep {
namespace {

namespace pb = ::google::protobuf;

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

}  // namespace

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
    if (location.empty() && name == "debug") {
      // A test hook that left the spec: say where it went rather than list the fields.
      return absl::InvalidArgumentError(
          "debug: no longer a spec field; faults are injected by the testing worker's flags "
          "(build/bin/testing/trainstep-worker --debug-nonfinite-grad-windows=W,…; "
          "docs/development.md)");
    }
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

}  // namespace trainstep
