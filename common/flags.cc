#include "common/flags.h"

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"

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

absl::Status ApplyLogFormatFlag(const std::string& value) {
  LogFormat format;
  if (!ParseLogFormat(value, &format)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--log-format must be text or json, got \"", value, "\""));
  }
  SetLogFormat(format);
  return absl::OkStatus();
}

absl::Status ParseCommandLineAndLogFormat(int argc, char** argv, const std::string& usage,
                                          const absl::Flag<std::string>& log_format) {
  ConfigureUsage(usage);
  std::vector<char*> args;
  const std::vector<std::string> storage = NormalizeFlagNames(argc, argv, &args);
  absl::ParseCommandLine(static_cast<int>(args.size()) - 1, args.data());
  return ApplyLogFormatFlag(absl::GetFlag(log_format));
}

}  // namespace trainstep
