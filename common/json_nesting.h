// A linear pre-check of JSON from files and users before protobuf's parser sees it: that
// parser recurses (and takes minutes) on deeply nested input, so hostile text is bounded first.
#ifndef TRAINSTEP_COMMON_JSON_NESTING_H_
#define TRAINSTEP_COMMON_JSON_NESTING_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace trainstep {

// INVALID_ARGUMENT "JSON nests deeper than <max_depth> levels (at byte <i>)" if `text` nests
// arrays/objects deeper than `max_depth`. Brackets inside strings ('...' too, which protobuf
// accepts) do not count; other syntax errors are left to the parser.
absl::Status CheckJsonNesting(absl::string_view text, int max_depth);

}  // namespace trainstep

#endif  // TRAINSTEP_COMMON_JSON_NESTING_H_
