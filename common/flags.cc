#include "common/flags.h"

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <set>

#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
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

namespace {

constexpr size_t kHelpWidth = 80;
constexpr char kHelpIndent[] = "      ";

// Columns, not bytes: the help strings have "…" and "≥".
size_t Columns(absl::string_view s) {
  return std::count_if(s.begin(), s.end(), [](char c) { return (c & 0xC0) != 0x80; });
}

// `text` wrapped at kHelpWidth, every line indented, as the CLI's help is laid out.
std::string Wrapped(absl::string_view text) {
  std::string out;
  std::string line;
  for (absl::string_view word : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    if (!line.empty() && Columns(kHelpIndent) + Columns(line) + 1 + Columns(word) > kHelpWidth) {
      absl::StrAppend(&out, kHelpIndent, line, "\n");
      line.clear();
    }
    absl::StrAppend(&line, line.empty() ? "" : " ", word);
  }
  return absl::StrCat(out, kHelpIndent, line, "\n");
}

// "  --name VALUE (default: D)", then the help text below it.
std::string FlagEntry(const absl::CommandLineFlag& flag) {
  std::string value;
  if (flag.IsOfType<bool>()) {
    value = "[=true|false]";
  } else if (flag.IsOfType<absl::Duration>()) {
    value = " DURATION";
  } else if (flag.IsOfType<double>()) {
    value = " NUMBER";
  } else if (flag.IsOfType<std::string>()) {
    value = " VALUE";
  } else if (flag.IsOfType<std::vector<std::string>>()) {
    value = " LIST";
  } else {
    value = " N";
  }
  std::string fallback = flag.DefaultValue();
  if (!fallback.empty() && flag.IsOfType<std::string>())
    fallback = absl::StrCat("\"", fallback, "\"");
  return absl::StrCat("  --", absl::StrReplaceAll(flag.Name(), {{"_", "-"}}), value,
                      fallback.empty() ? "" : absl::StrCat(" (default: ", fallback, ")"), "\n",
                      Wrapped(flag.Help()));
}

}  // namespace

std::vector<const absl::CommandLineFlag*> BinaryFlags() {
  std::vector<const absl::CommandLineFlag*> own;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (absl::EndsWith(flag->Filename(), "main.cc")) own.push_back(flag);
  }
  std::sort(own.begin(), own.end(),
            [](const absl::CommandLineFlag* a, const absl::CommandLineFlag* b) {
              return a->Name() < b->Name();
            });
  return own;
}

std::string HelpText(const BinaryHelp& help, const std::vector<const absl::CommandLineFlag*>& own) {
  std::string s = absl::StrCat(help.summary, "\n\nUsage:\n", help.usage, "\n");
  // A group may name any flag of the binary, its own or one a library it links defines.
  const auto find = [](absl::string_view name) -> const absl::CommandLineFlag* {
    return absl::FindCommandLineFlag(name);
  };
  std::set<absl::string_view> listed;
  std::vector<std::pair<std::string, std::vector<const absl::CommandLineFlag*>>> groups;
  for (const FlagGroup& g : help.groups) {
    groups.push_back({g.title, {}});
    for (const std::string& name : g.flags) {
      if (const absl::CommandLineFlag* f = find(name)) {
        groups.back().second.push_back(f);
        listed.insert(f->Name());
      }
    }
  }
  groups.push_back({"Other flags", {}});
  for (const absl::CommandLineFlag* f : own) {
    if (listed.count(f->Name()) == 0) groups.back().second.push_back(f);
  }
  for (const auto& [title, flags] : groups) {
    if (flags.empty()) continue;
    absl::StrAppend(&s, title, ":\n");
    for (const absl::CommandLineFlag* f : flags) absl::StrAppend(&s, FlagEntry(*f));
    absl::StrAppend(&s, "\n");
  }
  absl::StrAppend(&s,
                  "Flags may be written --like-this or --like_this, with a value after a space "
                  "or\nan '=' (booleans: --flag or --flag=false). -h, --help prints this; "
                  "--helpfull\nlists every flag, libraries' too.\n\n");
  if (!help.environment.empty()) absl::StrAppend(&s, "Environment:\n", help.environment, "\n");
  absl::StrAppend(&s, "Exit codes:\n", help.exit_codes, "\nExample:\n", help.example);
  return s;
}

bool WantsHelp(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const absl::string_view a = argv[i];
    if (a == "--") return false;
    if (a == "-h" || a == "--help" || a == "-help" || a == "--helpshort" || a == "-helpshort") {
      return true;
    }
  }
  return false;
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

absl::Status ParseCommandLineAndLogFormat(int argc, char** argv, const BinaryHelp& help,
                                          const absl::Flag<std::string>& log_format) {
  if (WantsHelp(argc, argv)) {
    std::cout << HelpText(help, BinaryFlags()) << std::flush;
    std::exit(0);
  }
  ConfigureUsage(absl::StrCat(help.summary, "\nUsage:\n", help.usage));
  std::vector<char*> args;
  const std::vector<std::string> storage = NormalizeFlagNames(argc, argv, &args);
  absl::ParseCommandLine(static_cast<int>(args.size()) - 1, args.data());
  return ApplyLogFormatFlag(absl::GetFlag(log_format));
}

}  // namespace trainstep
