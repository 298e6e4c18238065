// The worker's test hooks, as flags of the testing build only. trainstep-worker's main.cc calls
// these three functions; the shipped binary (build/bin/trainstep-worker) links
// no_fault_flags.cc, which defines no flag and injects nothing, and the testing binary
// (build/bin/testing/trainstep-worker, never installed or copied into an image) links
// fault_flags.cc, whose --debug-* flags configure InjectedFaults. So no test hook ships.
#ifndef TRAINSTEP_WORKER_FAULTS_FAULT_FLAGS_H_
#define TRAINSTEP_WORKER_FAULTS_FAULT_FLAGS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/flags.h"
#include "worker/faults/fault_injector.h"

namespace trainstep {

struct TestHooks {
  std::shared_ptr<const FaultInjector> faults;  // never null
  std::string cpuinfo_file;                     // read for /proc/cpuinfo when not empty
};

// Before the command line is parsed: INVALID_ARGUMENT naming the first --debug-* flag when this
// build has none, with where the testing build is; OK in the testing build.
absl::Status RefuseTestFlagsUnlessTesting(int argc, char** argv);

// Once it is parsed: the hooks the flags ask for; INVALID_ARGUMENT naming a bad value.
absl::StatusOr<TestHooks> TestHooksFromFlags();

// The test hooks' group of --help: none in the shipped build.
std::vector<FlagGroup> TestFlagGroups();

}  // namespace trainstep

#endif  // TRAINSTEP_WORKER_FAULTS_FAULT_FLAGS_H_
