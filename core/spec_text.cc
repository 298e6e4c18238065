#include "core/spec_text.h"

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace trainstep {

namespace pb = ::google::protobuf;

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

}  // namespace trainstep
