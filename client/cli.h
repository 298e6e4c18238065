// The whole `trainstep` program as a function: parse the line, print help or a usage
// error, or connect and run the command. main.cc passes the real process; tests pass
// argument vectors and string streams.
#ifndef TRAINSTEP_CLIENT_CLI_H_
#define TRAINSTEP_CLIENT_CLI_H_

#include <iosfwd>
#include <string>
#include <vector>

#include "common/tls.h"

namespace trainstep::client {

// What the CLI reads from its process besides the arguments.
struct ProcessEnvironment {
  std::string coordinator;  // $TRAINSTEP_COORDINATOR ("" = unset)
  bool no_color = false;    // $NO_COLOR is set
  bool stdout_tty = false;
  bool stderr_tty = false;
  // TRAINSTEP_TLS_CA, TRAINSTEP_TLS_CERT, TRAINSTEP_TLS_KEY, TRAINSTEP_TOKEN ("" = unset).
  EnvLookup security_env = [](const char*) { return std::string(); };
};

ProcessEnvironment ReadProcessEnvironment();

// `args` excludes the program name. Returns the exit code (see `trainstep --help`).
int RunCli(const std::vector<std::string>& args, const ProcessEnvironment& env, std::istream& in,
           std::ostream& out, std::ostream& err);

}  // namespace trainstep::client

#endif  // TRAINSTEP_CLIENT_CLI_H_
