#include "common/json_nesting.h"

#include "absl/strings/str_cat.h"

namespace trainstep {

absl::Status CheckJsonNesting(absl::string_view text, int max_depth) {
  int depth = 0;
  char quote = 0;  // the open string's quote; protobuf's parser also accepts '...'
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (quote != 0) {
      if (c == '\\') {
        ++i;
      } else if (c == quote) {
        quote = 0;
      }
      continue;
    }
    switch (c) {
      case '"':
      case '\'':
        quote = c;
        break;
      case '[':
      case '{':
        if (++depth > max_depth) {
          return absl::InvalidArgumentError(
              absl::StrCat("JSON nests deeper than ", max_depth, " levels (at byte ", i, ")"));
        }
        break;
      case ']':
      case '}':
        --depth;
        break;
      default:
        break;
    }
  }
  return absl::OkStatus();
}

}  // namespace trainstep
