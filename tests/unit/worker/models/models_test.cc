// BuildModel's TorchScript vocabulary: the model's own, read at load (worker/models/model.h).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/script.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/spec.h"
#include "tests/integration/torchscript_fixture.h"
#include "worker/models/model.h"

namespace trainstep {
namespace {

// A resolved spec for the TorchScript file `path`; `vocab_size` is the optional assertion.
v1::JobSpec SpecFor(const std::string& path, std::optional<int> vocab_size = std::nullopt) {
  const std::string vocab = vocab_size ? absl::StrCat(R"(,"vocab_size":)", *vocab_size) : "";
  absl::StatusOr<v1::JobSpec> spec =
      ParseAndResolveJobSpec(absl::StrCat(R"({"model":{"torchscript":{"path":")", path, "\"", vocab,
                                          R"(}},"data":{"jsonl":{"path":"/d.jsonl"}}})"));
  EXPECT_TRUE(spec.ok()) << spec.status();
  return spec.ok() ? *spec : v1::JobSpec();
}

class TorchScriptVocabularyTest : public ::testing::Test {
 protected:
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Path(const std::string& name) const { return dir_ + "/" + name; }

  // A model that needs two tokens: its forward fails on the one-token probe.
  std::string WriteTwoTokenModel(std::optional<int64_t> vocab_size_attribute) {
    torch::jit::Module m("TwoTokens");
    m.register_parameter("emb", torch::randn({50, 4}), /*is_buffer=*/false);
    m.register_parameter("out", torch::randn({4, 50}), false);
    if (vocab_size_attribute.has_value()) {
      m.register_attribute("vocab_size", c10::IntType::get(), *vocab_size_attribute);
    }
    m.define(R"(
def forward(self, input_ids):
    assert input_ids.size(1) > 1, "needs two tokens"
    return torch.matmul(torch.embedding(self.emb, input_ids), self.out)
)");
    const std::string path = Path(vocab_size_attribute ? "two-attr.pt" : "two.pt");
    m.save(path);
    return path;
  }

  const std::string dir_ = [] {
    const std::string d = absl::StrCat(::testing::TempDir(), "/models-test-", getpid());
    std::filesystem::create_directories(d);
    return d;
  }();
};

// Catches the vocabulary guessed (256, the old default) instead of taken from the model: a
// 50-class model without a vocab_size anywhere failed at its first forward.
TEST_F(TorchScriptVocabularyTest, TakenFromTheLogitsOfOneToken) {
  const std::string path = Path("lm50.pt");
  testing::WriteTinyTorchScript(path, /*dim=*/8, /*seed=*/1, /*vocab=*/50);
  v1::JobSpec spec = SpecFor(path);
  absl::StatusOr<std::unique_ptr<Model>> model = BuildModel(spec);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->VocabSize(), 50);
  // Recorded in the worker's spec, where the data's id check reads it.
  EXPECT_EQ(ModelVocabSize(spec), 0);
  RecordModelVocabulary(**model, spec);
  EXPECT_EQ(ModelVocabSize(spec), 50);
}

// Catches the vocab_size attribute ignored: a model that declares its vocabulary needs no
// probe (this one cannot take one token), and without the attribute the probe's failure
// names the field, the file and what the model said.
TEST_F(TorchScriptVocabularyTest, ItsVocabSizeAttributeIsRead) {
  absl::StatusOr<std::unique_ptr<Model>> model = BuildModel(SpecFor(WriteTwoTokenModel(50)));
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->VocabSize(), 50);

  const std::string bare = WriteTwoTokenModel(std::nullopt);
  model = BuildModel(SpecFor(bare));
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(model.status().message()),
              ::testing::AllOf(::testing::StartsWith(absl::StrCat(
                                   "model.torchscript.path: the model ", bare,
                                   " has no vocab_size attribute, and its forward failed on "
                                   "one token (input_ids int64 [1, 1] of zeros)")),
                               ::testing::HasSubstr("needs two tokens")));
}

// Catches a model.torchscript.vocab_size that disagrees with the model accepted until the
// first forward (or never, where the ids happen to fit): it fails at load naming both.
TEST_F(TorchScriptVocabularyTest, ASpecVocabSizeThatDisagreesFailsAtLoad) {
  const std::string path = Path("lm50.pt");
  testing::WriteTinyTorchScript(path, 8, 1, 50);
  absl::StatusOr<std::unique_ptr<Model>> model = BuildModel(SpecFor(path, 256));
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(model.status().message(),
            absl::StrCat("model.torchscript.vocab_size is 256, but the model ", path,
                         " has a vocabulary of 50 (its logits for one token)"));
  model = BuildModel(SpecFor(path, 50));  // agreeing: an assertion that holds
  ASSERT_TRUE(model.ok()) << model.status();

  const std::string declared = Path("lm50-attr.pt");
  testing::WriteTinyTorchScript(declared, 8, 1, 50, /*vocab_size_attribute=*/50);
  EXPECT_EQ(BuildModel(SpecFor(declared, 300)).status().message(),
            absl::StrCat("model.torchscript.vocab_size is 300, but the model ", declared,
                         " has a vocabulary of 50 (its vocab_size attribute)"));
}

// Catches a vocab_size attribute that is no int (or out of range) crashing the worker or
// taken as some number.
TEST_F(TorchScriptVocabularyTest, ABadVocabSizeAttributeIsNamed) {
  torch::jit::Module m("Odd");
  m.register_parameter("emb", torch::randn({4, 4}), false);
  m.register_attribute("vocab_size", c10::StringType::get(), std::string("fifty"));
  m.define("def forward(self, input_ids):\n    return torch.embedding(self.emb, input_ids)\n");
  const std::string odd = Path("odd.pt");
  m.save(odd);
  EXPECT_EQ(BuildModel(SpecFor(odd)).status().message(),
            absl::StrCat("model.torchscript.path: the model ", odd,
                         " has a vocab_size attribute of type String; it must be an int"));

  const std::string one = Path("one.pt");
  testing::WriteTinyTorchScript(one, 8, 1, 50, /*vocab_size_attribute=*/1);
  EXPECT_EQ(BuildModel(SpecFor(one)).status().message(),
            absl::StrCat("model.torchscript.path: the model ", one,
                         " has a vocabulary of 1 (its vocab_size attribute); it must be "
                         "2..1000000"));
}

}  // namespace
}  // namespace trainstep
