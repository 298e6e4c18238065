// trainstep: the client CLI. Everything lives in trainstep_client_lib; this only wires.
#include <grpc/support/log.h>

#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "client/cli.h"

int main(int argc, char** argv) {
  // gRPC logs a failed TLS handshake at ERROR, in its words, before the CLI says in one
  // sentence what went wrong; GRPC_VERBOSITY (e.g. =debug) brings its lines back.
  if (std::getenv("GRPC_VERBOSITY") == nullptr) gpr_set_log_function([](gpr_log_func_args*) {});
  const std::vector<std::string> args(argv + 1, argv + argc);
  return trainstep::client::RunCli(args, trainstep::client::ReadProcessEnvironment(), std::cin,
                                   std::cout, std::cerr);
}
