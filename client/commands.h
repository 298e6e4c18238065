// The `trainstep` commands, one function each. They take the JobService stub and the
// streams as parameters (tests pass an in-process coordinator's stub and string streams),
// print data on `out` and errors / progress on `err`, and return the process exit code.
// Every unary call has a deadline of `timeout`; the WatchJob stream has none.
#ifndef TRAINSTEP_CLIENT_COMMANDS_H_
#define TRAINSTEP_CLIENT_COMMANDS_H_

#include <grpcpp/grpcpp.h>

#include <iosfwd>
#include <optional>
#include <string>
#include <string_view>

#include "absl/time/time.h"
#include "client/args.h"
#include "client/export.h"
#include "common/clock.h"
#include "common/tls.h"
#include "trainstep/v1/job_service.grpc.pb.h"

namespace trainstep::client {

struct CommandContext {
  v1::JobService::StubInterface* stub = nullptr;
  std::string coordinator;   // the address, for messages
  ChannelSecurity security;  // how the stub's channel connects, for messages
  absl::Duration timeout = absl::Seconds(10);
  Output output = Output::kTable;
  std::istream* in = nullptr;   // `job submit -` reads the spec here
  std::ostream* out = nullptr;  // data
  std::ostream* err = nullptr;  // errors and progress
  bool live_progress = false;   // stderr is a terminal: redraw one progress line
  bool color_out = false;       // ANSI colours on `out`
  bool color_err = false;       // ANSI colours on `err`
  const Clock* clock = RealClock::Get();
  // Between reconnection attempts of a broken WatchJob stream.
  absl::Duration watch_retry_delay = absl::Milliseconds(500);
  // job watch gives up (kExitNoProgress) after this long without a new state or update;
  // unset = never.
  std::optional<absl::Duration> watch_no_progress_timeout;
};

int JobSubmit(const CommandContext& ctx, const std::string& spec_path,
              const std::string& request_id, bool watch);
int JobGet(const CommandContext& ctx, const std::string& job_id);
int JobList(const CommandContext& ctx);
int JobWatch(const CommandContext& ctx, const std::string& job_id);
int JobCancel(const CommandContext& ctx, const std::string& job_id);
int JobLogs(const CommandContext& ctx, const std::string& job_id);
// Writes the job's per-update log as an SVG picture to `out_path` ("-" = ctx.out).
int JobPlot(const CommandContext& ctx, const std::string& job_id, const std::string& out_path);
int WorkerList(const CommandContext& ctx, const std::string& job_id);
// Local files only: ctx.stub is not used. One line per file written on ctx.out.
int CheckpointExport(const CommandContext& ctx, const ExportOptions& options);

// Runs the command an Invocation names.
int RunCommand(const CommandContext& ctx, const Invocation& invocation);

// Prints what a failed call means on ctx.err and returns its exit code: INVALID_ARGUMENT,
// ALREADY_EXISTS (a reused request id) and a message over the size limit (a RESOURCE_EXHAUSTED
// that is not the coordinator's own, common/grpc_status.h IsCoordinatorError) → 2 (the
// coordinator's message as is), UNAVAILABLE / DEADLINE_EXCEEDED → 3 (with what to do, or what is
// wrong with TLS), NOT_FOUND → 4, UNAUTHENTICATED / PERMISSION_DENIED → 8, anything else → 1.
int ReportRpcError(const CommandContext& ctx, const grpc::Status& status);

// The default request id of `job submit`: a hash of the spec's bytes and the minute of `now`,
// so that an accidental double submit within a minute returns the job the first one created.
std::string DefaultRequestId(std::string_view spec_bytes, absl::Time now);

// The exit code of a job that ended: 0 SUCCEEDED, 5 FAILED, 6 CANCELLED (1 if not ended).
int ExitCodeOfJob(const v1::Job& job);

}  // namespace trainstep::client

#endif  // TRAINSTEP_CLIENT_COMMANDS_H_
