// Fuzzes the worker's data readers (worker/data/dataset.h, Torch-free) with arbitrary bytes as
// a JSONL file or a text file, under a model whose vocabulary and context the input picks.
// Checks that errors are INVALID_ARGUMENT, and that every sample loaded is one the model can
// take: ids inside the vocabulary, labels inside it or -100, input_ids and labels of one
// length, text samples of 2..seq_len tokens, JSONL samples within the model's context.
#include <stdlib.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/spec.h"
#include "tests/fuzz/fuzz_util.h"
#include "worker/data/dataset.h"

namespace trainstep {
namespace {

using fuzz::FuzzInput;

// One file, rewritten for every input; removed at exit.
const std::string& DataFile() {
  static const std::string* path = [] {
    const char* tmp = std::getenv("TMPDIR");
    std::string dir = absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp",
                                   "/trainstep-dataset-fuzz.XXXXXX");
    if (::mkdtemp(dir.data()) == nullptr) std::abort();
    static std::string kept = dir;
    std::atexit([] { std::filesystem::remove_all(kept); });
    return new std::string(dir + "/data");
  }();
  return *path;
}

void Write(const std::string& path, const std::string& bytes) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  FUZZ_CHECK(f != nullptr);
  FUZZ_CHECK(std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size());
  FUZZ_CHECK(std::fclose(f) == 0);
}

void Run(FuzzInput& in) {
  const bool jsonl = in.Bool();
  const bool torchscript = in.Bool();                          // Else tiny_gpt.
  const int64_t vocab = torchscript ? in.Range(2, 300) : 256;  // the resolver refuses < 2
  const int64_t seq_len = in.Range(2, 64);
  const std::string model =
      torchscript ? absl::StrCat(R"({"torchscript":{"path":"/m.pt","vocab_size":)", vocab, "}}")
                  : absl::StrCat(R"({"tiny_gpt":{"seq_len":)", seq_len, "}}");
  const std::string data =
      jsonl ? absl::StrCat(R"({"jsonl":{"path":")", DataFile(), R"("}})")
            : absl::StrCat(R"({"text":{"paths":[")", DataFile(), R"("],"seq_len":)", seq_len, "}}");
  const std::string json = absl::StrCat(R"({"name":"fuzz","model":)", model, R"(,"data":)", data,
                                        R"(,"optimizer":{"sgd":{"lr":0.1}}})");
  absl::StatusOr<v1::JobSpec> spec = ParseAndResolveJobSpec(json);
  FUZZ_CHECK(spec.ok(), spec.status().ToString() + "\n" + json);
  Write(DataFile(), in.Rest());

  absl::StatusOr<data::Dataset> dataset = data::Dataset::Load(*spec);
  if (!dataset.ok()) {
    FUZZ_CHECK(dataset.status().code() == absl::StatusCode::kInvalidArgument,
               dataset.status().ToString());
    return;
  }
  FUZZ_CHECK(dataset->size() >= 1);
  FUZZ_CHECK(dataset->token_level());
  FUZZ_CHECK(dataset->fingerprint().size() == 16);
  for (int64_t i = 0; i < dataset->size(); ++i) {
    const data::Sample& s = dataset->at(i);
    FUZZ_CHECK(!s.input_ids.empty() && s.input_ids.size() == s.labels.size());
    FUZZ_CHECK(s.features.empty() && s.targets.empty());
    if (!jsonl) {
      FUZZ_CHECK(s.input_ids.size() >= 2 && static_cast<int64_t>(s.input_ids.size()) <= seq_len);
      FUZZ_CHECK(s.labels == s.input_ids);
    } else if (!torchscript) {
      FUZZ_CHECK(static_cast<int64_t>(s.input_ids.size()) <= seq_len);
    }
    for (size_t t = 0; t < s.input_ids.size(); ++t) {
      FUZZ_CHECK(s.input_ids[t] >= 0 && s.input_ids[t] < vocab);
      FUZZ_CHECK(s.labels[t] == data::kIgnoreLabel || (s.labels[t] >= 0 && s.labels[t] < vocab));
    }
    const int64_t valid = data::ValidTokens(s);
    FUZZ_CHECK(valid >= 0 && valid < static_cast<int64_t>(s.labels.size()));
  }
}

}  // namespace
}  // namespace trainstep

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  trainstep::fuzz::FuzzInput in(data, size);
  trainstep::Run(in);
  return 0;
}
