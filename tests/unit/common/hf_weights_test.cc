// HfWeights: a Hugging Face model directory read as hostile input (common/hf_weights.h).
#include "common/hf_weights.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/safetensors_format.h"

namespace trainstep {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// A safetensors file of zero-filled tensors.
void WriteSafetensors(const std::string& path,
                      const std::vector<ckpt::SafetensorsTensorInfo>& tensors) {
  uint64_t data_bytes = 0;
  absl::StatusOr<std::string> prefix = ckpt::SafetensorsFilePrefix(tensors, {}, &data_bytes);
  ASSERT_TRUE(prefix.ok()) << prefix.status();
  std::ofstream(path, std::ios::binary) << *prefix << std::string(data_bytes, '\0');
}

constexpr auto kF32 = ckpt::SafetensorsDtype::kF32;
constexpr auto kBF16 = ckpt::SafetensorsDtype::kBF16;

class HfWeightsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fs::create_directories(dir_);
    Write("config.json", R"({"hidden_size": 4})");
    WriteSafetensors(dir_ + "/a.safetensors", {{"x", kF32, {2, 2}}});
    WriteSafetensors(dir_ + "/b.safetensors", {{"y", kBF16, {3}}});
  }
  void TearDown() override { fs::remove_all(dir_); }
  void Write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ + "/" + name) << text;
  }
  std::string Error() {
    absl::StatusOr<std::unique_ptr<HfWeights>> w =
        HfWeights::Open(dir_, AllowedRoots(), "model.llama.path");
    return w.ok() ? "OK" : std::string(w.status().message());
  }
  const std::string dir_ = absl::StrCat(::testing::TempDir(), "/hf-weights-test-", getpid());
};

// A sharded directory reads as one set of tensors, each from the shard the index names.
TEST_F(HfWeightsTest, ShardsReadAsOneSet) {
  Write("model.safetensors.index.json",
        R"({"metadata":{"total_size":22},"weight_map":{"x":"a.safetensors","y":"b.safetensors"}})");
  absl::StatusOr<std::unique_ptr<HfWeights>> w =
      HfWeights::Open(dir_ + "/", AllowedRoots(), "model.llama.path");
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ((*w)->config_json(), R"({"hidden_size": 4})");
  ASSERT_EQ((*w)->tensors().size(), 2u);
  EXPECT_EQ((*w)->tensors().at("y").file, "b.safetensors");
  EXPECT_EQ((*w)->tensors().at("y").dtype, ckpt::SafetensorsDtype::kBF16);
  EXPECT_EQ((*w)->tensors().at("x").shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ((*w)->total_bytes(), 16u + 6u);
}

// Catches an index that reads files outside the model's directory (a shard named "../x").
TEST_F(HfWeightsTest, ShardNamesStayInTheDirectory) {
  for (const std::string& bad : {"../a.safetensors", "/etc/passwd", "..", "a.bin", ""}) {
    Write("model.safetensors.index.json", absl::StrCat(R"({"weight_map":{"x":")", bad, R"("}})"));
    EXPECT_THAT(Error(), HasSubstr("which is not a .safetensors file name in the same directory"))
        << bad;
  }
}

// Catches an index and its shards that disagree being trained on with a tensor missing or
// taken from the wrong shard.
TEST_F(HfWeightsTest, IndexAndShardsMustAgree) {
  Write("model.safetensors.index.json",
        R"({"weight_map":{"x":"b.safetensors","y":"b.safetensors"}})");
  EXPECT_THAT(Error(), HasSubstr("puts tensor 'x' in b.safetensors, which does not hold it"));
  Write("model.safetensors.index.json", R"({"weight_map":{"x":"a.safetensors"}})");
  EXPECT_EQ(Error(), "OK");  // b.safetensors is not a shard of this index: never opened
  WriteSafetensors(dir_ + "/a.safetensors", {{"x", kF32, {2}}, {"z", kF32, {1}}});
  EXPECT_THAT(Error(), HasSubstr("holds tensor 'z', which model.safetensors.index.json does not"));
  Write("model.safetensors.index.json", R"({"weight_map":{"x":"c.safetensors"}})");
  EXPECT_THAT(Error(), HasSubstr("c.safetensors does not exist"));
  Write("model.safetensors.index.json", R"({"weights":{}})");
  EXPECT_THAT(Error(), HasSubstr("has no weight_map"));
  Write("model.safetensors.index.json", R"({"weight_map":{"x":3}})");
  EXPECT_THAT(Error(), HasSubstr("must be a shard's file name"));
  Write("model.safetensors.index.json", "[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]");
  EXPECT_THAT(Error(), HasSubstr("model.safetensors.index.json"));
}

// A directory without weights, without config.json, or not a directory: each names what a
// Hugging Face directory holds.
TEST_F(HfWeightsTest, MissingPiecesAreNamed) {
  EXPECT_THAT(Error(), HasSubstr("has neither model.safetensors nor model.safetensors.index.json"));
  fs::copy(dir_ + "/a.safetensors", dir_ + "/model.safetensors");
  EXPECT_EQ(Error(), "OK");
  fs::resize_file(dir_ + "/model.safetensors", 20);
  EXPECT_THAT(Error(), HasSubstr(dir_ + "/model.safetensors: "));
  fs::remove(dir_ + "/config.json");
  EXPECT_THAT(Error(), HasSubstr("config.json does not exist"));
  absl::StatusOr<std::unique_ptr<HfWeights>> file =
      HfWeights::Open(dir_ + "/a.safetensors", AllowedRoots(), "model.llama.path");
  EXPECT_THAT(std::string(file.status().message()), HasSubstr("is not a directory"));
}

}  // namespace
}  // namespace trainstep
