// Fuzzes journal recovery (coordinator/journal.h) with arbitrary bytes as the files of a journal
// directory: one log, a snapshot, a snapshot and its log, or two logs. Checks what Journal::Open
// promises: a failure is DATA_LOSS and changes nothing on disk; a success recovers a journal
// that appends after its last intact record, so that opening it again recovers the same
// records plus the appended one, and drops nothing more.
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/journal.h"
#include "tests/fuzz/fuzz_util.h"
#include "tests/unit/coordinator/fault_injection_env.h"

namespace trainstep {
namespace {

using fuzz::FuzzInput;

constexpr char kDir[] = "/j";

std::map<std::string, std::string> Files(InMemoryEnv& env) {
  std::map<std::string, std::string> files;
  absl::StatusOr<std::vector<std::string>> names = env.ListDir(kDir);
  FUZZ_CHECK(names.ok());
  for (const std::string& name : *names) {
    files[name] = env.Contents(absl::StrCat(kDir, "/", name)).value_or("<not a file>");
  }
  return files;
}

std::string Describe(const RecoveredJournal& r) {
  std::string out = absl::StrCat(r.snapshot ? "snapshot + " : "", r.records.size(), " records");
  for (const std::string& w : r.warnings) absl::StrAppend(&out, "\n  warning: ", w);
  return out;
}

void Run(FuzzInput& in) {
  InMemoryEnv env;
  FUZZ_CHECK(env.CreateDirs(kDir).ok());
  const auto put = [&env](const std::string& name, std::string bytes) {
    const std::string path = absl::StrCat(kDir, "/", name);
    FUZZ_CHECK(env.CreateFile(path, /*truncate=*/true).ok());
    env.SetContents(path, std::move(bytes));
  };
  bool has_snapshot = false;
  switch (in.Byte() % 4) {
    case 0:
      put("log-000001", in.Rest());
      break;
    case 1:
      put("snapshot-000001", in.Rest());
      has_snapshot = true;
      break;
    case 2:
      put("snapshot-000002", in.String(4096, /*wide=*/true));
      put("log-000002", in.Rest());
      has_snapshot = true;
      break;
    default:
      put("log-000001", in.String(4096, /*wide=*/true));  // Not the newest: may not be torn.
      put("log-000002", in.Rest());
      break;
  }
  const std::map<std::string, std::string> before = Files(env);

  RecoveredJournal first;
  absl::StatusOr<std::unique_ptr<Journal>> journal = Journal::Open(&env, kDir, {}, &first);
  if (!journal.ok()) {
    FUZZ_CHECK(journal.status().code() == absl::StatusCode::kDataLoss, journal.status().ToString());
    FUZZ_CHECK(Files(env) == before, "a failed Open changed the journal's files");
    return;
  }
  FUZZ_CHECK(first.snapshot.has_value() == has_snapshot, Describe(first));
  FUZZ_CHECK((*journal)->records_since_snapshot() == first.records.size());

  const uint64_t seq = (*journal)->Append("appended after recovery");
  FUZZ_CHECK((*journal)->Sync(seq).ok());
  journal->reset();

  RecoveredJournal second;
  journal = Journal::Open(&env, kDir, {}, &second);
  FUZZ_CHECK(journal.ok(), journal.status().ToString() + "\nfirst open: " + Describe(first));
  FUZZ_CHECK(second.snapshot == first.snapshot);
  std::vector<std::string> expected = first.records;
  expected.push_back("appended after recovery");
  FUZZ_CHECK(second.records == expected,
             "first open: " + Describe(first) + "\nsecond open: " + Describe(second));
  for (const std::string& w : second.warnings) {
    FUZZ_CHECK(w.find("dropped") == std::string::npos, "second open: " + Describe(second));
  }
}

}  // namespace
}  // namespace trainstep

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  trainstep::fuzz::FuzzInput in(data, size);
  trainstep::Run(in);
  return 0;
}
