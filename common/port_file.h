#ifndef TRAINSTEP_COMMON_PORT_FILE_H_
#define TRAINSTEP_COMMON_PORT_FILE_H_

// --port-file: how a process started with port 0 tells its launcher (tests, scripts) which
// ports it got. One JSON object, written whole (temporary file + rename) so a reader never
// sees half of it.

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace trainstep {

// Writes {"<name>": <port>, ...} in the given order to `path`. The error names the file.
absl::Status WritePortFile(const std::string& path,
                           const std::vector<std::pair<std::string, int>>& ports);

}  // namespace trainstep

#endif  // TRAINSTEP_COMMON_PORT_FILE_H_
