// trainstep: the client CLI. Everything lives in trainstep_client_lib; this only wires.
#include <iostream>
#include <string>
#include <vector>

#include "client/cli.h"

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  return trainstep::client::RunCli(args, trainstep::client::ReadProcessEnvironment(), std::cin,
                                   std::cout, std::cerr);
}
