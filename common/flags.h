// Lets every binary take --kebab-case flags (the CLI convention) while declaring them with
// Abseil's snake_case ABSL_FLAG names: "--state-dir=x" becomes "--state_dir=x".
#ifndef TRAINSTEP_COMMON_FLAGS_H_
#define TRAINSTEP_COMMON_FLAGS_H_

#include <string>
#include <vector>

namespace trainstep {

// Rewrites dashes in flag names (not values) up to a bare "--"; returns storage whose
// c_str()s `argv_out` points into.
std::vector<std::string> NormalizeFlagNames(int argc, char** argv, std::vector<char*>* argv_out);

// Sets the usage message and makes --help list the flags defined in the binary's main.cc
// (Abseil's default looks for a file named like the binary and finds none).
void ConfigureUsage(const std::string& usage);

}  // namespace trainstep

#endif  // TRAINSTEP_COMMON_FLAGS_H_
