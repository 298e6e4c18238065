#include "worker/checkpoint/checkpoint_dir.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/env.h"
#include "common/xxh64.h"
#include "tests/unit/worker/checkpoint/fixtures.h"

namespace trainstep::ckpt {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

using fixture::MetaFor;

TensorMap Model(float value) {
  return {{"layer.weight", at::full({3, 4}, value)},
          {"layer.bias", at::arange(4, at::kFloat) + value},
          {"emb", at::full({2, 2}, value).to(at::kBFloat16)}};
}

TensorMap Optimizer(float value) {
  return {{"state.0.exp_avg", at::full({3, 4}, value / 2)},
          {"state.0.step", at::scalar_tensor(static_cast<int64_t>(value), at::kLong)}};
}

void ExpectSame(const TensorMap& actual, const TensorMap& expected) {
  ASSERT_EQ(actual.size(), expected.size());
  for (const auto& [name, t] : expected) {
    ASSERT_EQ(actual.count(name), 1u) << name;
    EXPECT_EQ(actual.at(name).scalar_type(), t.scalar_type()) << name;
    EXPECT_TRUE(at::equal(actual.at(name), t)) << name;
  }
}

// The directory's entries but the claim marker (its own tests look at it).
std::set<std::string> Entries(const std::string& dir) {
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.insert(e.path().filename().string());
  names.erase(kClaimFile);
  return names;
}

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteText(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

class CheckpointDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "checkpoint_dir_test.XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    root_ = tmpl;
    dir_ = root_ + "/ckpts";
  }
  void TearDown() override { fs::remove_all(root_); }

  std::string Write(int64_t id, float value, int keep_last = 0, Env* env = Env::Default(),
                    const std::string& job_id = MetaFor(0).job_id) {
    CheckpointMeta meta = MetaFor(id);
    meta.job_id = job_id;
    absl::StatusOr<std::string> path =
        WriteCheckpoint(dir_, meta, Model(value), Optimizer(value), keep_last, env);
    EXPECT_TRUE(path.ok()) << path.status();
    return path.ok() ? *path : "";
  }

  std::string root_;
  std::string dir_;  // Not created: WriteCheckpoint must create it.
};

// Catches any field, tensor or dtype lost between WriteCheckpoint and ReadCheckpoint.
TEST_F(CheckpointDirTest, WriteReadRoundTrip) {
  const std::string path = Write(3, 1.5f);
  EXPECT_EQ(path, dir_ + "/ckpt-3");
  EXPECT_THAT(Entries(dir_), ElementsAre("ckpt-3"));
  EXPECT_THAT(Entries(path),
              UnorderedElementsAre("model.safetensors", "optimizer.safetensors", "meta.json"));
  absl::StatusOr<LoadedCheckpoint> loaded = ReadCheckpoint(dir_, 3);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->path, path);
  CheckpointMeta expected = MetaFor(3);
  expected.file_xxh64 = {
      {"model.safetensors", Xxh64Of(ReadText(path + "/model.safetensors"))},
      {"optimizer.safetensors", Xxh64Of(ReadText(path + "/optimizer.safetensors"))}};
  EXPECT_TRUE(loaded->meta == expected);
  ExpectSame(loaded->model, Model(1.5f));
  ExpectSame(loaded->optimizer, Optimizer(1.5f));
}

// Catches a checkpoint damaged after its write (a flipped bit on disk, a torn copy) being loaded
// and trained on: every file's digest is in meta.json, and a read checks them all.
TEST_F(CheckpointDirTest, AFileDamagedAfterItsWriteIsDataLossNamingIt) {
  Write(2, 1.0f);
  const std::string path = Write(3, 1.5f);
  const std::string model = path + "/model.safetensors";
  std::string bytes = ReadText(model);
  bytes[bytes.size() - 3] ^= 0x10;  // inside the last tensor's data: the header still parses
  WriteText(model, bytes);
  absl::StatusOr<LoadedCheckpoint> loaded = ReadCheckpoint(dir_, 3);
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(loaded.status().message(), HasSubstr(model + " is corrupt"));
  EXPECT_EQ(LatestCheckpoint(dir_).value(), std::optional<int64_t>(2));

  fs::remove(model);
  EXPECT_EQ(ReadCheckpoint(dir_, 3).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(ReadCheckpoint(dir_, 9).status().code(), absl::StatusCode::kNotFound);  // never was
}

// Catches checkpoints written before digests existed becoming unreadable.
TEST_F(CheckpointDirTest, ACheckpointWithoutDigestsIsReadAsBefore) {
  const std::string path = Write(3, 1.5f);
  std::string meta = ReadText(path + "/meta.json");
  const size_t from = meta.find(",\n  \"xxh64\"");
  ASSERT_NE(from, std::string::npos) << meta;
  meta = meta.substr(0, from) + "\n}\n";
  WriteText(path + "/meta.json", meta);
  absl::StatusOr<LoadedCheckpoint> loaded = ReadCheckpoint(dir_, 3);
  ASSERT_TRUE(loaded.ok()) << loaded.status() << meta;
  EXPECT_TRUE(loaded->meta == MetaFor(3));
  ExpectSame(loaded->model, Model(1.5f));
}

// Catches a model's own files (a Hugging Face config.json) missing from its checkpoints, or an
// extra file that could replace the checkpoint's tensors or escape its directory.
TEST_F(CheckpointDirTest, ExtraFilesAreWrittenBesideTheTensors) {
  WriteOptions options;
  options.extra_files = {{"config.json", "{\"hidden_size\": 8}\n"}};
  absl::StatusOr<std::string> path =
      WriteCheckpoint(dir_, MetaFor(4), Model(1.0f), Optimizer(1.0f), 0, Env::Default(), options);
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_THAT(Entries(*path), UnorderedElementsAre("model.safetensors", "optimizer.safetensors",
                                                   "meta.json", "config.json"));
  EXPECT_EQ(ReadText(*path + "/config.json"), "{\"hidden_size\": 8}\n");
  ASSERT_TRUE(ReadCheckpoint(dir_, 4).ok());

  for (const std::string bad : {"model.safetensors", "meta.json", "model.safetensors.index.json",
                                "model-00001-of-00002.safetensors", "../x", "a/b", ".hidden", ""}) {
    WriteOptions refused_options;
    refused_options.extra_files = {{bad, "x"}};
    absl::StatusOr<std::string> refused = WriteCheckpoint(
        dir_, MetaFor(5), Model(1.0f), Optimizer(1.0f), 0, Env::Default(), refused_options);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_THAT(Entries(dir_), ElementsAre("ckpt-4"));
}

// Catches a large model's checkpoint written as one file that the ecosystem's tools refuse to
// load in one piece, shards that do not read back as the same tensors, or a checkpoint missing a
// shard taken for complete.
TEST_F(CheckpointDirTest, ModelAboveTheShardSizeIsShardedWithAnIndex) {
  WriteOptions options;
  options.max_shard_bytes = 30;  // emb (8 bytes) + layer.bias (16) | layer.weight (48)
  absl::StatusOr<std::string> path =
      WriteCheckpoint(dir_, MetaFor(6), Model(2.5f), Optimizer(2.5f), 0, Env::Default(), options);
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_THAT(
      Entries(*path),
      UnorderedElementsAre("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                           "model.safetensors.index.json", "optimizer.safetensors", "meta.json"));
  const std::string index = ReadText(*path + "/model.safetensors.index.json");
  EXPECT_THAT(index, HasSubstr("\"total_size\": 72"));
  EXPECT_THAT(index, HasSubstr("\"emb\": \"model-00001-of-00002.safetensors\""));
  EXPECT_THAT(index, HasSubstr("\"layer.weight\": \"model-00002-of-00002.safetensors\""));
  absl::StatusOr<LoadedCheckpoint> loaded = ReadCheckpoint(dir_, 6);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ExpectSame(loaded->model, Model(2.5f));
  ExpectSame(loaded->optimizer, Optimizer(2.5f));
  EXPECT_EQ(LatestCheckpoint(dir_).value(), std::optional<int64_t>(6));
  EXPECT_EQ(loaded->meta.file_xxh64.size(), 4u);  // both shards, the index, the optimizer
  EXPECT_EQ(loaded->meta.file_xxh64.at("model.safetensors.index.json"),
            Xxh64Of(ReadText(*path + "/model.safetensors.index.json")));

  Write(3, 1.0f);  // unsharded, older
  fs::remove(*path + "/model-00002-of-00002.safetensors");
  EXPECT_EQ(LatestCheckpoint(dir_).value(), std::optional<int64_t>(3));
  EXPECT_FALSE(ReadCheckpoint(dir_, 6).ok());
}

// Catches meta.json that is not plain, readable JSON or misses a field.
TEST_F(CheckpointDirTest, MetaJsonIsReadablePrettyJsonWithAllFields) {
  const std::string text = ReadText(Write(3, 1.5f) + "/meta.json");
  EXPECT_THAT(text, HasSubstr("\n  \"job_id\": \"job-\\\"7\\\"\",\n"));
  EXPECT_THAT(text, HasSubstr("\n  \"loss_scale\": 0.1,\n"));
  google::protobuf::Struct json;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(text, &json).ok()) << text;
  std::set<std::string> keys;
  for (const auto& [key, unused] : json.fields()) keys.insert(key);
  EXPECT_THAT(
      keys, UnorderedElementsAre("job_id", "checkpoint_id", "optimizer_update_id", "scheduler_step",
                                 "window_id", "epoch", "cumulative_tokens", "loss_scale",
                                 "scaler_growth_tracker", "spec_hash", "next_window_id",
                                 "written_unix_ms", "xxh64"));
  EXPECT_EQ(json.fields().at("job_id").string_value(), "job-\"7\"");
  EXPECT_EQ(json.fields().at("checkpoint_id").number_value(), 3);
  EXPECT_EQ(json.fields().at("written_unix_ms").number_value(), 1732881600123.0);
  EXPECT_EQ(json.fields().at("loss_scale").number_value(), 0.1);
  // Beyond 2^53 a JSON number would be rounded by most readers, so it is a string.
  EXPECT_EQ(json.fields().at("cumulative_tokens").string_value(), "9223372036854775807");
}

// Catches retention deleting the wrong end, too many, or too few; and keep_last=0 deleting any.
TEST_F(CheckpointDirTest, KeepLastRetainsTheNewest) {
  for (int id = 0; id < 6; ++id) Write(id, static_cast<float>(id), /*keep_last=*/2);
  EXPECT_THAT(Entries(dir_), ElementsAre("ckpt-4", "ckpt-5"));
  for (int id = 6; id < 9; ++id) Write(id, static_cast<float>(id), /*keep_last=*/0);
  EXPECT_THAT(Entries(dir_), ElementsAre("ckpt-4", "ckpt-5", "ckpt-6", "ckpt-7", "ckpt-8"));
  Write(9, 9.0f, /*keep_last=*/1);
  EXPECT_THAT(Entries(dir_), ElementsAre("ckpt-9"));
}

// Catches retention deleting the checkpoint just written when older-numbered ones sort after it.
TEST_F(CheckpointDirTest, RetentionNeverDeletesTheOneJustWritten) {
  Write(10, 10.0f);
  Write(11, 11.0f);
  Write(3, 3.0f, /*keep_last=*/1);
  EXPECT_TRUE(Entries(dir_).count("ckpt-3"));
  EXPECT_EQ(Entries(dir_).size(), 1u);
  ASSERT_TRUE(ReadCheckpoint(dir_, 3).ok());
}

// Catches LatestCheckpoint returning a temp dir, a half-written or corrupt checkpoint, or a
// non-canonical name.
TEST_F(CheckpointDirTest, LatestCheckpointSkipsIncompleteAndTemporary) {
  Write(1, 1.0f);
  Write(2, 2.0f);
  // A copy of ckpt-2 under `name` whose meta.json says `id`.
  const auto copy = [this](const std::string& name, int64_t id) {
    fs::copy(dir_ + "/ckpt-2", dir_ + "/" + name, fs::copy_options::recursive);
    WriteText(dir_ + "/" + name + "/meta.json", *CheckpointMetaToJson(MetaFor(id)));
  };
  copy(".ckpt-9.tmp-123", 9);  // A complete temp dir: still not a checkpoint.
  copy("ckpt-05", 5);          // Non-canonical names.
  copy("ckpt-x", 2);
  copy("ckpt-6", 6);  // Missing a file.
  fs::remove(dir_ + "/ckpt-6/optimizer.safetensors");
  copy("ckpt-5", 5);  // Truncated model.
  fs::resize_file(dir_ + "/ckpt-5/model.safetensors", 100);
  copy("ckpt-4", 2);  // meta.json of another checkpoint.
  copy("ckpt-3", 3);  // meta.json cut short.
  fs::resize_file(dir_ + "/ckpt-3/meta.json", 20);
  WriteText(dir_ + "/ckpt-8", "a file, not a directory");
  fs::create_directory(dir_ + "/ckpt-7");  // Empty.

  absl::StatusOr<std::optional<int64_t>> latest = LatestCheckpoint(dir_);
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(*latest, std::optional<int64_t>(2));
  EXPECT_THAT(ReadCheckpoint(dir_, 4).status().message(), HasSubstr("checkpoint_id is 2, not 4"));
  EXPECT_EQ(ReadCheckpoint(dir_, 5).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(ReadCheckpoint(dir_, 6).status().code(), absl::StatusCode::kDataLoss);
}

// Catches an error (instead of "none") for an empty or not-yet-created directory.
TEST_F(CheckpointDirTest, LatestCheckpointOfEmptyOrMissingDirIsNone) {
  absl::StatusOr<std::optional<int64_t>> missing = LatestCheckpoint(dir_);
  ASSERT_TRUE(missing.ok()) << missing.status();
  EXPECT_FALSE(missing->has_value());
  fs::create_directory(dir_);
  absl::StatusOr<std::optional<int64_t>> empty = LatestCheckpoint(dir_);
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_FALSE(empty->has_value());
  EXPECT_EQ(ReadCheckpoint(dir_, 0).status().code(), absl::StatusCode::kNotFound);
}

// Catches rewriting an id failing (rename onto a non-empty dir) or keeping the old contents.
TEST_F(CheckpointDirTest, RewritingTheSameIdReplacesIt) {
  Write(7, 1.0f);
  Write(7, 2.0f);
  EXPECT_THAT(Entries(dir_), ElementsAre("ckpt-7"));  // No temp or set-aside leftovers.
  absl::StatusOr<LoadedCheckpoint> loaded = ReadCheckpoint(dir_, 7);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ExpectSame(loaded->model, Model(2.0f));
  ExpectSame(loaded->optimizer, Optimizer(2.0f));
}

// An Env that logs operations and can fail the first one a predicate picks.
#define RETURN_IF_FAILS(op) \
  if (Fails(op)) return absl::UnavailableError("injected failure: " + std::string(op))
class ScriptedEnv : public EnvWrapper {
 public:
  ScriptedEnv() : EnvWrapper(Env::Default()) {}

  // Ops are logged as "<op> <path>[ -> <to>]"; the first matching `fail_when` fails.
  std::function<bool(const std::string&)> fail_when = [](const std::string&) { return false; };
  std::vector<std::string> log;

  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override {
    RETURN_IF_FAILS("create " + path);
    absl::StatusOr<std::unique_ptr<WritableFile>> f = target()->NewWritableFile(path);
    if (!f.ok()) return f;
    return std::unique_ptr<WritableFile>(new File(this, path, *std::move(f)));
  }
  absl::Status RenameFile(const std::string& from, const std::string& to) override {
    RETURN_IF_FAILS("rename " + from + " -> " + to);
    return target()->RenameFile(from, to);
  }
  absl::Status SyncDir(const std::string& dir) override {
    RETURN_IF_FAILS("syncdir " + dir);
    return target()->SyncDir(dir);
  }
  absl::Status DeleteFile(const std::string& path) override {
    RETURN_IF_FAILS("delete " + path);
    return target()->DeleteFile(path);
  }

 private:
  // Logs `op`; returns true (and disarms) if it must fail.
  bool Fails(const std::string& op) {
    log.push_back(op);
    if (!fail_when(op)) return false;
    fail_when = [](const std::string&) { return false; };
    log.back() += " FAILED";
    return true;
  }

  class File : public WritableFile {
   public:
    File(ScriptedEnv* env, std::string path, std::unique_ptr<WritableFile> f)
        : env_(env), path_(std::move(path)), f_(std::move(f)) {}
    absl::Status Append(std::string_view data) override { return f_->Append(data); }
    absl::Status Sync() override {
      if (env_->Fails("sync " + path_)) return absl::UnavailableError("injected fsync failure");
      return f_->Sync();
    }
    absl::Status Close() override { return f_->Close(); }

   private:
    ScriptedEnv* env_;
    std::string path_;
    std::unique_ptr<WritableFile> f_;
  };
};

size_t IndexOf(const std::vector<std::string>& log, const std::string& prefix,
               const std::string& contains = "") {
  for (size_t i = 0; i < log.size(); ++i) {
    if (absl::StartsWith(log[i], prefix) && absl::StrContains(log[i], contains)) return i;
  }
  ADD_FAILURE() << "no " << prefix << " ... " << contains;
  return log.size();
}

// Catches a checkpoint made visible before its files and temp dir are durable, or the parent
// dir not synced after the rename.
TEST_F(CheckpointDirTest, SyncsEverythingBeforeTheRenameAndTheDirAfter) {
  ScriptedEnv env;
  Write(4, 1.0f, 0, &env);
  const std::string tmp = absl::StrCat(dir_, "/.ckpt-4.tmp-", ::getpid());
  const size_t rename = IndexOf(env.log, "rename " + tmp + " -> " + dir_ + "/ckpt-4");
  EXPECT_LT(IndexOf(env.log, "sync " + tmp + "/model.safetensors"), rename);
  EXPECT_LT(IndexOf(env.log, "sync " + tmp + "/optimizer.safetensors"), rename);
  EXPECT_LT(IndexOf(env.log, "sync " + tmp + "/meta.json"), rename);
  EXPECT_LT(IndexOf(env.log, "syncdir " + tmp), rename);
  // `dir` was created, so its parent is synced; `dir` itself after the rename, last.
  EXPECT_LT(IndexOf(env.log, "syncdir " + root_), rename);
  EXPECT_EQ(env.log.back(), "syncdir " + dir_);
}

// Catches a failed write leaving a visible (or a stray temp) checkpoint behind.
TEST_F(CheckpointDirTest, FailedWriteLeavesNothingVisible) {
  Write(1, 1.0f);
  ScriptedEnv env;
  env.fail_when = [](const std::string& op) {
    return absl::StartsWith(op, "sync ") && absl::EndsWith(op, "optimizer.safetensors");
  };
  absl::StatusOr<std::string> path =
      WriteCheckpoint(dir_, MetaFor(2), Model(2.0f), Optimizer(2.0f), 0, &env);
  EXPECT_EQ(path.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(Entries(dir_), ElementsAre("ckpt-1"));
  EXPECT_EQ(*LatestCheckpoint(dir_), std::optional<int64_t>(1));
}

// Catches a failed replacement losing the checkpoint it was replacing.
TEST_F(CheckpointDirTest, FailedReplacementRestoresTheOldCheckpoint) {
  Write(7, 1.0f);
  ScriptedEnv env;
  env.fail_when = [this](const std::string& op) {
    return absl::StartsWith(op, "rename ") && absl::EndsWith(op, " -> " + dir_ + "/ckpt-7");
  };
  absl::StatusOr<std::string> path =
      WriteCheckpoint(dir_, MetaFor(7), Model(2.0f), Optimizer(2.0f), 0, &env);
  EXPECT_EQ(path.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(Entries(dir_), ElementsAre("ckpt-7"));
  absl::StatusOr<LoadedCheckpoint> loaded = ReadCheckpoint(dir_, 7);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ExpectSame(loaded->model, Model(1.0f));
}

// Catches a failing fsync of the directory being reported as success (not durable, so not ackable).
TEST_F(CheckpointDirTest, FailedDirSyncAfterRenameIsAnError) {
  ScriptedEnv env;
  env.fail_when = [this](const std::string& op) { return op == "syncdir " + dir_; };
  fs::create_directory(dir_);
  absl::StatusOr<std::string> path =
      WriteCheckpoint(dir_, MetaFor(1), Model(1.0f), Optimizer(1.0f), 0, &env);
  EXPECT_EQ(path.status().code(), absl::StatusCode::kUnavailable);
}

// Catches crashed writers' temp dirs piling up forever, or a live newer one being deleted.
TEST_F(CheckpointDirTest, PrunesLeftoversOfLowerIdsOnly) {
  Write(1, 1.0f);
  for (const char* name : {".ckpt-1.tmp-999", ".ckpt-0.old-999", ".ckpt-9.tmp-999"}) {
    fs::create_directory(dir_ + "/" + name);
    WriteText(dir_ + "/" + name + "/model.safetensors", "partial");
  }
  WriteText(dir_ + "/notes.txt", "not ours");
  Write(2, 2.0f);
  EXPECT_THAT(Entries(dir_), ElementsAre(".ckpt-9.tmp-999", "ckpt-1", "ckpt-2", "notes.txt"));
}

// Catches the probe's deletion of someone else's checkpoints: a job pointed at a directory
// holding another job's ckpt-0..ckpt-4 (written before markers existed) with keep_last 1 is
// refused, names the other job, and deletes nothing; the owner still writes and prunes there.
TEST_F(CheckpointDirTest, AnotherJobsCheckpointsAreNeverDeleted) {
  for (int id = 0; id < 5; ++id) Write(id, static_cast<float>(id), 0, Env::Default(), "job-a");
  fs::remove(dir_ + "/" + kClaimFile);  // as an older trainstep left it
  const std::set<std::string> before = Entries(dir_);
  CheckpointMeta meta = MetaFor(9);
  meta.job_id = "job-b";
  absl::StatusOr<std::string> path =
      WriteCheckpoint(dir_, meta, Model(9.0f), Optimizer(9.0f), /*keep_last=*/1);
  EXPECT_EQ(path.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(path.status().message()), HasSubstr("written by job-a"));
  EXPECT_EQ(Entries(dir_), before);
  EXPECT_FALSE(fs::exists(dir_ + "/" + kClaimFile));
  // The owner (its meta.json names it) claims the directory and prunes its own.
  Write(5, 5.0f, /*keep_last=*/2, Env::Default(), "job-a");
  EXPECT_THAT(Entries(dir_), ElementsAre("ckpt-4", "ckpt-5"));
  EXPECT_EQ(ReadText(dir_ + "/" + kClaimFile), "job-a\n");
}

// Catches two jobs sharing a directory: once claimed, another job's write is refused naming
// the owner; and even a foreign checkpoint that got in (a race before the marker) is neither
// counted nor deleted by the owner's retention.
TEST_F(CheckpointDirTest, ClaimedDirRefusesOtherJobsAndPrunesOnlyItsOwn) {
  Write(1, 1.0f, 0, Env::Default(), "job-a");
  CheckpointMeta meta = MetaFor(2);
  meta.job_id = "job-b";
  absl::StatusOr<std::string> refused =
      WriteCheckpoint(dir_, meta, Model(2.0f), Optimizer(2.0f), /*keep_last=*/1);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("belongs to job-a"));
  EXPECT_THAT(Entries(dir_), ElementsAre("ckpt-1"));

  const std::string other = root_ + "/other";
  meta.checkpoint_id = 0;
  ASSERT_TRUE(WriteCheckpoint(other, meta, Model(0.5f), Optimizer(0.5f), 0).ok());
  fs::rename(other + "/ckpt-0", dir_ + "/ckpt-0");  // job-b's, inside job-a's directory
  Write(2, 2.0f, /*keep_last=*/1, Env::Default(), "job-a");
  Write(3, 3.0f, /*keep_last=*/1, Env::Default(), "job-a");
  EXPECT_THAT(Entries(dir_), ElementsAre("ckpt-0", "ckpt-3"));
}

// Catches a claim that is not durable (a crash could lose it, and another job then claim the
// directory): the marker's content is fsynced before its rename, and the directory after.
TEST_F(CheckpointDirTest, ClaimIsDurable) {
  ScriptedEnv env;
  ASSERT_TRUE(ClaimCheckpointDir(dir_, "job-a", &env).ok());
  const std::string marker = dir_ + "/" + kClaimFile;
  const std::string tmp = absl::StrCat(marker, ".tmp-", ::getpid());
  const size_t rename = IndexOf(env.log, "rename " + tmp + " -> " + marker);
  EXPECT_LT(IndexOf(env.log, "sync " + tmp), rename);
  EXPECT_LT(IndexOf(env.log, "syncdir " + root_), rename);  // the new directory itself
  EXPECT_EQ(env.log.back(), "syncdir " + dir_);
  EXPECT_TRUE(ClaimCheckpointDir(dir_, "job-a").ok());  // idempotent
  EXPECT_EQ(ClaimCheckpointDir(dir_, "job-b").code(), absl::StatusCode::kFailedPrecondition);
}

// Catches arguments that would write an unreadable or misnamed checkpoint.
TEST_F(CheckpointDirTest, RejectsBadArguments) {
  CheckpointMeta bad = MetaFor(-1);
  EXPECT_EQ(WriteCheckpoint(dir_, bad, {}, {}, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(WriteCheckpoint(dir_, MetaFor(1), {}, {}, -1).status().code(),
            absl::StatusCode::kInvalidArgument);
  bad = MetaFor(1);
  bad.loss_scale = std::nan("");
  EXPECT_EQ(WriteCheckpoint(dir_, bad, {}, {}, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::StatusOr<std::string> bad_tensor =
      WriteCheckpoint(dir_, MetaFor(1), {{"w", at::zeros({1}, at::kComplexDouble)}}, {}, 0);
  EXPECT_EQ(bad_tensor.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad_tensor.status().message(), HasSubstr("tensor 'w'"));
  EXPECT_FALSE(fs::exists(dir_ + "/ckpt-1"));
  EXPECT_TRUE(!fs::exists(dir_) || Entries(dir_).empty());  // Temp dir cleaned up.
  EXPECT_EQ(ReadCheckpoint(dir_, -1).status().code(), absl::StatusCode::kInvalidArgument);
}

// Catches an empty model or optimizer (a fresh optimizer has no state) being unwritable.
TEST_F(CheckpointDirTest, EmptyTensorMapsRoundTrip) {
  absl::StatusOr<std::string> path = WriteCheckpoint(dir_, MetaFor(0), {}, {}, 0);
  ASSERT_TRUE(path.ok()) << path.status();
  absl::StatusOr<LoadedCheckpoint> loaded = ReadCheckpoint(dir_, 0);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_TRUE(loaded->model.empty());
  EXPECT_TRUE(loaded->optimizer.empty());
  EXPECT_EQ(*LatestCheckpoint(dir_), std::optional<int64_t>(0));
}

#undef RETURN_IF_FAILS

}  // namespace
}  // namespace trainstep::ckpt
