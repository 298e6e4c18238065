#ifndef TRAINSTEP_CORE_SPEC_PARSE_ERROR_H_
#define TRAINSTEP_CORE_SPEC_PARSE_ERROR_H_

// Protobuf's JSON parser (3.21) reports errors in its own English ("INVALID_ARGUMENT:
// optimizer.lr: invalid value ..."): this turns them into "<field.path>: <what to do>",
// naming the line and column of a syntax error. It depends on protobuf's exact wording, which
// tests/unit/core/spec_parse_error_test.cc pins, so an upgrade that changes it fails there
// first rather than degrading every message silently.

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace trainstep {

// `json`: the spec text as parsed; `message`: protobuf's error message for it. Always
// INVALID_ARGUMENT; an unrecognised message passes through unchanged after its prefix.
absl::Status RewriteParseError(absl::string_view json, absl::string_view message);

}  // namespace trainstep

#endif  // TRAINSTEP_CORE_SPEC_PARSE_ERROR_H_
