// Lets every binary take --kebab-case flags (the CLI convention) while declaring them with
// Abseil's snake_case ABSL_FLAG names: "--state-dir=x" becomes "--state_dir=x". And the
// command-line prologue and the --help the coordinator and the worker share.
#ifndef TRAINSTEP_COMMON_FLAGS_H_
#define TRAINSTEP_COMMON_FLAGS_H_

#include <string>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/flag.h"
#include "absl/status/status.h"

namespace trainstep {

// Rewrites dashes in flag names (not values) up to a bare "--"; returns storage whose
// c_str()s `argv_out` points into.
std::vector<std::string> NormalizeFlagNames(int argc, char** argv, std::vector<char*>* argv_out);

// Sets the usage message of Abseil's own --helpfull, which lists every flag of the binary,
// its libraries' too.
void ConfigureUsage(const std::string& usage);

// One heading of a server binary's --help and the flags under it, by their declared
// (snake_case) names, in the order shown.
struct FlagGroup {
  std::string title;
  std::vector<std::string> flags;
};

// A server binary's --help, in the CLI's style. Each flag's line is its ABSL_FLAG help and
// default, read at run time, so the text cannot drift from the definitions.
struct BinaryHelp {
  std::string summary;  // one line: what the binary does
  std::string usage;    // "  trainstep-x [flags]" lines
  std::vector<FlagGroup> groups;
  std::string environment;  // "  NAME  meaning" lines
  std::string exit_codes;   // "  N  meaning" lines
  std::string example;      // command lines
};

// The flags the binary defines itself (in a file named main.cc), sorted by name.
std::vector<const absl::CommandLineFlag*> BinaryFlags();

// The --help text: each group's flags (any of the binary's) as --kebab-names, then an `own`
// flag that no group names under "Other flags" (so a new one is listed before it is grouped).
std::string HelpText(const BinaryHelp& help, const std::vector<const absl::CommandLineFlag*>& own);

// Whether the line asks for help: -h, --help or --helpshort (one dash too) before a bare "--".
bool WantsHelp(int argc, char** argv);

// Sets the log's format from a --log-format value: INVALID_ARGUMENT (and nothing set) when it
// is not text or json.
absl::Status ApplyLogFormatFlag(const std::string& value);

// The first step of a server binary's main, once per process. When WantsHelp: HelpText(help)
// on stdout and exit 0. Else the command line parsed (--kebab-case names too; --helpfull
// exits there), then ApplyLogFormatFlag of `log_format`, the binary's own flag (an ABSL_FLAG
// in its main.cc, so that --help lists it). Each binary exits with its own code on an error.
absl::Status ParseCommandLineAndLogFormat(int argc, char** argv, const BinaryHelp& help,
                                          const absl::Flag<std::string>& log_format);

}  // namespace trainstep

#endif  // TRAINSTEP_COMMON_FLAGS_H_
