#include "common/flags.h"

#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"

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

void ConfigureUsage(const std::string& usage) {
  absl::SetProgramUsageMessage(usage + "\nFlags may be written --like-this or --like_this.");
  absl::FlagsUsageConfig config;
  auto ours = [](absl::string_view file) { return absl::EndsWith(file, "main.cc"); };
  config.contains_helpshort_flags = ours;
  config.contains_help_flags = ours;
  absl::SetFlagsUsageConfig(config);
}

}  // namespace trainstep
