#include "common/flags.h"

namespace trainstep {

std::vector<std::string> NormalizeFlagNames(int argc, char** argv, std::vector<char*>* argv_out) {
  std::vector<std::string> args(argv, argv + argc);
  bool flags_done = false;
  for (size_t i = 1; i < args.size(); ++i) {
    std::string& a = args[i];
    if (a == "--") flags_done = true;
    if (flags_done || a.size() < 3 || a.compare(0, 2, "--") != 0) continue;
    const size_t end = a.find('=') == std::string::npos ? a.size() : a.find('=');
    for (size_t k = 2; k < end; ++k) {
      if (a[k] == '-') a[k] = '_';
    }
  }
  argv_out->clear();
  for (std::string& a : args) argv_out->push_back(a.data());
  argv_out->push_back(nullptr);
  return args;
}

}  // namespace trainstep
