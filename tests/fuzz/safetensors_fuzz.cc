// Fuzzes the safetensors reader's validation (common/safetensors_format.h) with
// arbitrary bytes as a file. The LibTorch half (building tensors from a validated header,
// worker/checkpoint/safetensors.h) stays out of the fuzz build; it only copies the ranges
// checked here. Checks that a header accepted describes tensors that lie inside the data,
// pack it exactly, and have the byte size their shape and dtype need.
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "common/safetensors_format.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace trainstep::ckpt;
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<SafetensorsHeader> header = ParseSafetensorsHeader(bytes);
  const absl::Status validated = ValidateSafetensors(bytes);
  FUZZ_CHECK(validated == header.status(),
             validated.ToString() + "\nvs\n" + header.status().ToString());
  if (!header.ok()) {
    FUZZ_CHECK(header.status().code() == absl::StatusCode::kInvalidArgument,
               header.status().ToString());
    return 0;
  }
  // The data section is the file's tail.
  FUZZ_CHECK(header->data.data() + header->data.size() == bytes.data() + bytes.size());
  uint64_t covered = 0;
  for (size_t i = 0; i < header->entries.size(); ++i) {
    const SafetensorsEntry& e = header->entries[i];
    if (i > 0) FUZZ_CHECK(header->entries[i - 1].name < e.name, "entries not sorted by name");
    FUZZ_CHECK(e.name != "__metadata__");
    FUZZ_CHECK(e.begin <= e.end && e.end <= header->data.size(), e.name);
    uint64_t elements = 1;
    for (int64_t dim : e.shape) {
      FUZZ_CHECK(dim >= 0, e.name);
      FUZZ_CHECK(!__builtin_mul_overflow(elements, static_cast<uint64_t>(dim), &elements), e.name);
    }
    FUZZ_CHECK(elements <= (uint64_t{1} << 62), e.name);
    FUZZ_CHECK(e.end - e.begin == elements * SafetensorsElementSize(e.dtype), e.name);
    FUZZ_CHECK(SafetensorsDtypeFromName(SafetensorsDtypeName(e.dtype)) == e.dtype);
    if (e.dtype == SafetensorsDtype::kBool) {
      for (uint64_t b = e.begin; b < e.end; ++b) {
        FUZZ_CHECK(static_cast<unsigned char>(header->data[b]) <= 1, e.name);
      }
    }
    covered += e.end - e.begin;
  }
  FUZZ_CHECK(covered == header->data.size(), "the tensors do not cover the data exactly");
  return 0;
}
