// Lets every binary take --kebab-case flags (the CLI convention) while declaring them with
// Abseil's snake_case ABSL_FLAG names: "--state-dir=x" becomes "--state_dir=x". And the
// command-line prologue the coordinator and the worker share.
#ifndef TRAINSTEP_COMMON_FLAGS_H_
#define TRAINSTEP_COMMON_FLAGS_H_

#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"

namespace trainstep {

// Rewrites dashes in flag names (not values) up to a bare "--"; returns storage whose
// c_str()s `argv_out` points into.
std::vector<std::string> NormalizeFlagNames(int argc, char** argv, std::vector<char*>* argv_out);

// Sets the usage message and makes --help list the flags defined in the binary's main.cc
// (Abseil's default looks for a file named like the binary and finds none).
void ConfigureUsage(const std::string& usage);

// Sets the log's format from a --log-format value: INVALID_ARGUMENT (and nothing set) when it
// is not text or json.
absl::Status ApplyLogFormatFlag(const std::string& value);

// The first step of a server binary's main, once per process: ConfigureUsage(usage), the
// command line parsed (--kebab-case names too; --help exits here), then ApplyLogFormatFlag of
// `log_format`, the binary's own flag (an ABSL_FLAG in its main.cc, so that --help lists it).
// Each binary exits with its own code on an error.
absl::Status ParseCommandLineAndLogFormat(int argc, char** argv, const std::string& usage,
                                          const absl::Flag<std::string>& log_format);

}  // namespace trainstep

#endif  // TRAINSTEP_COMMON_FLAGS_H_
