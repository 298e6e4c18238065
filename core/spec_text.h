#ifndef TRAINSTEP_CORE_SPEC_TEXT_H_
#define TRAINSTEP_CORE_SPEC_TEXT_H_

// How values and choices are written in the job spec's error messages, shared by the resolver
// (core/spec.cc) and the parse-error rewriter (core/spec_parse_error.cc).

#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"
#include "google/protobuf/descriptor.h"

namespace trainstep {

// The shortest decimal that reads back as `v`, so "got 1.0000001" never prints as "got 1".
std::string FormatDouble(double v);
// A C0 control, DEL, or a C1 control (U+0080..U+009F, encoded C2 80..C2 9F) starts at s[i].
bool IsControlAt(absl::string_view s, size_t i);
// A string as it would be written in the JSON spec, so "\u0007" shows where the bad byte is.
std::string Quote(absl::string_view s);
// "fp32, bf16, fp16": the values a user may write, without the *_UNSPECIFIED placeholder.
std::string EnumChoices(const google::protobuf::EnumDescriptor* e);
// A message's field names, and a oneof's, comma-separated in declaration order.
std::string FieldNames(const google::protobuf::Descriptor* d);
std::string OneofNames(const google::protobuf::OneofDescriptor* o);

}  // namespace trainstep

#endif  // TRAINSTEP_CORE_SPEC_TEXT_H_
