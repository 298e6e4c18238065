// Fuzzes the JobSpec JSON parser and resolver (core/spec.h) with arbitrary bytes as a spec,
// checking the contracts spec.h states: errors are INVALID_ARGUMENT; printing a parsed spec
// reads back to the same message; resolving is idempotent; the hash is a function of the
// resolved spec.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "core/spec.h"
#include "tests/fuzz/fuzz_util.h"

namespace trainstep {
namespace {

std::string Bytes(const v1::JobSpec& spec) {
  std::string out;
  spec.SerializeToString(&out);  // Deterministic for one binary: no maps in JobSpec.
  return out;
}

void CheckInvalidArgument(const absl::Status& status) {
  FUZZ_CHECK(status.code() == absl::StatusCode::kInvalidArgument, status.ToString());
  FUZZ_CHECK(!status.message().empty());
}

// JobSpecToJson's output parses back to `spec`, pretty or not.
void CheckPrintRoundTrip(const v1::JobSpec& spec) {
  for (bool pretty : {false, true}) {
    const std::string json = JobSpecToJson(spec, pretty);
    absl::StatusOr<v1::JobSpec> back = ParseJobSpecJson(json);
    FUZZ_CHECK(back.ok(), back.status().ToString() + "\n" + json);
    FUZZ_CHECK(Bytes(*back) == Bytes(spec), json + "\nreads back as\n" + JobSpecToJson(*back));
  }
}

}  // namespace
}  // namespace trainstep

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace trainstep;
  const std::string_view json(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<v1::JobSpec> parsed = ParseJobSpecJson(json);
  if (!parsed.ok()) {
    CheckInvalidArgument(parsed.status());
    return 0;
  }
  CheckPrintRoundTrip(*parsed);

  absl::StatusOr<v1::JobSpec> resolved = ResolveJobSpec(*parsed);
  if (!resolved.ok()) {
    CheckInvalidArgument(resolved.status());
    return 0;
  }
  absl::StatusOr<v1::JobSpec> again = ResolveJobSpec(*resolved);
  FUZZ_CHECK(again.ok(), again.status().ToString());
  FUZZ_CHECK(Bytes(*again) == Bytes(*resolved), "resolving a resolved spec changed it");
  CheckPrintRoundTrip(*resolved);
  FUZZ_CHECK(JobSpecHash(*again) == JobSpecHash(*resolved));
  FUZZ_CHECK(JobSpecHash(*resolved).size() == 16);
  FUZZ_CHECK(GlobalBatchSamples(*resolved) >= 1);
  absl::StatusOr<v1::JobSpec> via_text = ParseAndResolveJobSpec(json);
  FUZZ_CHECK(via_text.ok() && Bytes(*via_text) == Bytes(*resolved));
  (void)IsTokenLevel(*resolved);
  return 0;
}
