// Fuzzes the parser of a checkpoint's meta.json (worker/checkpoint/checkpoint_meta.h) with
// arbitrary bytes as the file. Checks that errors are INVALID_ARGUMENT, and that whatever is
// accepted is a meta the writer can write again and that reads back equal (so a resumed job
// never runs on a value the writer would have refused, like a non-finite loss scale).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "tests/fuzz/fuzz_util.h"
#include "worker/checkpoint/checkpoint_meta.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace trainstep::ckpt;
  const absl::string_view json(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<CheckpointMeta> meta = CheckpointMetaFromJson(json);
  if (!meta.ok()) {
    FUZZ_CHECK(meta.status().code() == absl::StatusCode::kInvalidArgument,
               meta.status().ToString());
    return 0;
  }
  FUZZ_CHECK(std::isfinite(meta->loss_scale), "accepted a non-finite loss_scale");
  absl::StatusOr<std::string> written = CheckpointMetaToJson(*meta);
  FUZZ_CHECK(written.ok(), written.status().ToString());
  absl::StatusOr<CheckpointMeta> back = CheckpointMetaFromJson(*written);
  FUZZ_CHECK(back.ok(), back.status().ToString() + "\n" + *written);
  FUZZ_CHECK(*back == *meta, *written);
  FUZZ_CHECK(std::signbit(back->loss_scale) == std::signbit(meta->loss_scale), *written);
  return 0;
}
