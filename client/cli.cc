#include "client/cli.h"

#include <unistd.h>

#include <cstdlib>
#include <iostream>

#include "client/args.h"
#include "client/commands.h"
#include "client/format.h"
#include "common/channel.h"

namespace trainstep::client {

ProcessEnvironment ReadProcessEnvironment() {
  ProcessEnvironment env;
  if (const char* c = std::getenv("TRAINSTEP_COORDINATOR")) env.coordinator = c;
  env.no_color = std::getenv("NO_COLOR") != nullptr;
  env.stdout_tty = isatty(STDOUT_FILENO) == 1;
  env.stderr_tty = isatty(STDERR_FILENO) == 1;
  env.security_env = ProcessEnv();
  return env;
}

int RunCli(const std::vector<std::string>& args, const ProcessEnvironment& env, std::istream& in,
           std::ostream& out, std::ostream& err) {
  const ParsedArgs parsed = ParseArgs(args, env.coordinator);
  switch (parsed.kind) {
    case ParsedArgs::Kind::kHelp:
      out << parsed.text;
      return kExitOk;
    case ParsedArgs::Kind::kUsageError:
      err << Colorize("error:", Color::kRed, env.stderr_tty && !env.no_color) << " " << parsed.text
          << "\n";
      return kExitUsage;
    case ParsedArgs::Kind::kRun:
      break;
  }
  const Invocation& inv = parsed.invocation;
  CommandContext ctx;
  ctx.coordinator = inv.coordinator;
  ctx.timeout = inv.timeout;
  if (inv.timeout_given) ctx.watch_no_progress_timeout = inv.timeout;
  ctx.output = inv.output;
  ctx.in = &in;
  ctx.out = &out;
  ctx.err = &err;
  ctx.live_progress = env.stderr_tty;
  ctx.color_out = env.stdout_tty && !env.no_color;
  ctx.color_err = env.stderr_tty && !env.no_color;
  // A local command must not fail on credentials it never uses.
  std::unique_ptr<v1::JobService::Stub> stub;
  if (NeedsCoordinator(inv.command)) {
    absl::StatusOr<ChannelSecurity> security =
        ResolveChannelSecurity(inv.security, env.security_env);
    if (!security.ok()) {
      err << Colorize("error:", Color::kRed, ctx.color_err) << " " << security.status().message()
          << "\n";
      return kExitUsage;
    }
    // Keepalive and UNAVAILABLE retries as every trainstep client; the watch stream relies on
    // the keepalive to notice a vanished coordinator.
    stub = v1::JobService::NewStub(MakeChannel(inv.coordinator, *security));
    ctx.security = *security;
    ctx.stub = stub.get();
  }
  const int rc = RunCommand(ctx, inv);
  out.flush();
  return rc;
}

}  // namespace trainstep::client
