// The `trainstep` command line: a small hand-written parser (noun–verb commands, global
// flags anywhere on the line, --help at every level) and the usage texts. Pure functions:
// the environment comes in as arguments, nothing is printed here.
#ifndef TRAINSTEP_CLIENT_ARGS_H_
#define TRAINSTEP_CLIENT_ARGS_H_

#include <string>
#include <vector>

#include "absl/time/time.h"
#include "client/export.h"
#include "common/tls.h"

namespace trainstep::client {

// The process exit codes, documented in `trainstep --help`.
enum ExitCode : int {
  kExitOk = 0,
  kExitError = 1,         // any other error
  kExitUsage = 2,         // bad flags, unreadable SPEC file, INVALID_ARGUMENT
  kExitUnavailable = 3,   // coordinator not reachable / no answer in time
  kExitNotFound = 4,      // unknown job
  kExitJobFailed = 5,     // the watched job FAILED
  kExitJobCancelled = 6,  // the watched job was CANCELLED
  kExitNoProgress = 7,    // job watch --timeout: the job made no progress for that long
  kExitDenied = 8,        // UNAUTHENTICATED or PERMISSION_DENIED: no credential, or no role
};

enum class Command {
  kJobSubmit,
  kJobGet,
  kJobList,
  kJobWatch,
  kJobCancel,
  kJobLogs,
  kJobPlot,
  kWorkerList,
  kCheckpointExport
};
enum class Output { kTable, kJson, kJsonl };

// "job submit", "worker list", ...
std::string CommandName(Command command);

// Whether the command talks to the coordinator (checkpoint export works on local files only).
bool NeedsCoordinator(Command command);

// A command line that parsed: what to run and how.
struct Invocation {
  Command command = Command::kJobList;
  std::string coordinator;  // resolved: flag, else $TRAINSTEP_COORDINATOR, else the default
  Output output = Output::kTable;
  absl::Duration timeout = absl::Seconds(10);  // per unary call
  bool timeout_given = false;                  // --timeout on the line (job watch uses it)
  std::string job_id;                          // job get|watch|cancel|logs ID; worker list --job
  std::string spec_path;                       // job submit; "-" = stdin
  std::string request_id;        // job submit --request-id; empty = derived from the spec
  bool watch = false;            // job submit --watch
  std::string out_path;          // job plot --out; "-" = stdout
  ExportOptions export_options;  // checkpoint export: CKPT_DIR, --out, --dtype, --max-shard-size
  // --tls-ca, --tls-cert, --tls-key, --token-file as given; their variables fill the gaps
  // when the CLI connects (common/tls.h ResolveChannelSecurity).
  ChannelSecurityFlags security;
};

struct ParsedArgs {
  enum class Kind { kRun, kHelp, kUsageError };
  Kind kind = Kind::kUsageError;
  Invocation invocation;  // kRun only
  // kHelp: the usage text of the level asked for (print on stdout, exit 0).
  // kUsageError: one line naming the problem, then where to read the usage.
  std::string text;
};

// `args` excludes the program name. `env_coordinator` is $TRAINSTEP_COORDINATOR ("" = unset).
ParsedArgs ParseArgs(const std::vector<std::string>& args, const std::string& env_coordinator);

// Usage texts, by level: "" (top), a noun ("job", "worker", "checkpoint"), or a full command
// name ("job submit").
std::string UsageText(const std::string& level);

}  // namespace trainstep::client

#endif  // TRAINSTEP_CLIENT_ARGS_H_
