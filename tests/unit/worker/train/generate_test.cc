#include "worker/train/generate.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace trainstep {
namespace {

// Catches --generate on a model trained on another tokenizer's ids (model.tiny_gpt.vocab_size
// other than 256): its prompt would be read as bytes and its ids printed as bytes, garbage
// presented as the model's text. Refused before any checkpoint is read.
TEST(GenerateTest, RefusesAModelThatIsNotByteLevel) {
  std::string tmpl = "/tmp/trainstep_generate_test_XXXXXX";
  const std::string dir = mkdtemp(tmpl.data());
  std::ofstream(SpecPathFor(dir)) << R"({"model":{"tiny_gpt":{"vocab_size":50304}},)"
                                  << R"("data":{"tokens":{"path":"/t.bin","dtype":"uint16"}}})";
  GenerateOptions options;
  options.checkpoint = dir + "/ckpt-1";
  absl::StatusOr<std::string> text = Generate(options);
  std::filesystem::remove_all(dir);
  EXPECT_EQ(text.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(text.status().message(),
            "--generate reads and prints bytes: it needs a byte-level model (vocab_size 256), got "
            "vocab_size 50304");
}

}  // namespace
}  // namespace trainstep
