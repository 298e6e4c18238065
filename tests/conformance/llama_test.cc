// model.llama held to an independent plain-PyTorch Llama (llama_reference.py beside this file,
// run by Debian's python3 with its torch): the same directory in Hugging Face layout gives the
// same logits, and one accumulation window through the real coordinator and worker processes
// gives the same trained weights at W = 1 and W = 2, for a Llama (untied head, grouped-query
// attention) and a Qwen2-style model (q/k/v biases, tied head, sharded bf16 file).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/safetensors_format.h"
#include "tests/conformance/harness.h"
#include "tests/conformance/reference.h"

namespace trainstep::conformance {
namespace {

namespace fs = std::filesystem;

constexpr double kTolerance = 1e-5;

// Grouped-query attention (2 query heads per KV head), untied head, fp32 weights.
constexpr char kLlamaConfig[] =
    R"({"architectures":["LlamaForCausalLM"],"model_type":"llama","hidden_size":32,)"
    R"("intermediate_size":64,"num_hidden_layers":2,"num_attention_heads":4,)"
    R"("num_key_value_heads":2,"vocab_size":61,"max_position_embeddings":64,)"
    R"("rms_norm_eps":1e-5,"rope_theta":10000.0,"hidden_act":"silu","tie_word_embeddings":false})";
// Qwen2: q/k/v biases (o_proj none), tied head, 4 query heads per KV head, another theta.
constexpr char kQwen2Config[] =
    R"({"architectures":["Qwen2ForCausalLM"],"model_type":"qwen2","hidden_size":32,)"
    R"("intermediate_size":48,"num_hidden_layers":2,"num_attention_heads":4,)"
    R"("num_key_value_heads":1,"vocab_size":61,"max_position_embeddings":64,)"
    R"("rms_norm_eps":1e-6,"rope_theta":1000000.0,"tie_word_embeddings":true,)"
    R"("use_sliding_window":false,"sliding_window":64,"max_window_layers":2})";

// Four samples of different lengths (right padding inside a micro-batch), some labels
// masked: one window of W·K·B = 4 samples.
constexpr char kData[] =
    "{\"input_ids\":[1,5,9,13,17,21,25,29,33],\"labels\":[1,5,9,13,17,21,25,29,33]}\n"
    "{\"input_ids\":[60,2,4,8,16,32,3,6,12,24,48,7],"
    "\"labels\":[-100,-100,-100,8,16,32,3,6,12,24,48,7]}\n"
    "{\"input_ids\":[7,14,21,28,35],\"labels\":[7,14,21,28,35]}\n"
    "{\"input_ids\":[0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15],"
    "\"labels\":[0,1,2,3,4,5,6,7,8,9,10,11,12,13,-100,-100]}\n";

// Runs `command`; its exit status, stdout and stderr in *output.
int RunCommand(const std::string& command, std::string* output) {
  std::FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return -1;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), pipe)) > 0) output->append(buf, n);
  const int status = ::pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// Every tensor's dtype, shape and raw bytes in a Hugging Face directory (all its
// .safetensors files), by name.
absl::StatusOr<std::map<std::string, std::string>> TensorBytes(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() != ".safetensors") continue;
    const std::string bytes = testing::ReadFile(entry.path().string());
    absl::StatusOr<ckpt::SafetensorsHeader> header = ckpt::ParseSafetensorsHeader(bytes);
    if (!header.ok()) return header.status();
    for (const ckpt::SafetensorsEntry& e : header->entries) {
      out[e.name] =
          absl::StrCat(ckpt::SafetensorsDtypeName(e.dtype), " [", absl::StrJoin(e.shape, ","), "] ",
                       header->data.substr(e.begin, e.end - e.begin));
    }
  }
  return out;
}

void ReplaceOnce(std::string& text, const std::string& from, const std::string& to) {
  const size_t at = text.find(from);
  ASSERT_NE(at, std::string::npos) << from;
  text.replace(at, from.size(), to);
}

class LlamaTest : public ConformanceTest {
 protected:
  // make test's machine has Debian's python3-torch (scripts/install-deps.sh); the LibTorch 2.6
  // root of make check-gpu-build has no Python torch, and lists this skip with its reason.
  // $TRAINSTEP_REFERENCE_PYTHON (a GPU machine's PyTorch) replaces it.
  void SetUp() override {
    const char* python = std::getenv("TRAINSTEP_REFERENCE_PYTHON");
    python_ = python != nullptr && *python != '\0' ? python : "/usr/bin/python3";
    std::string out;
    if (RunCommand(python_ + " -c 'import torch, numpy'", &out) != 0) {
      GTEST_SKIP() << "the independent reference needs " << python_ << " with torch: " << out;
    }
    ConformanceTest::SetUp();
  }

  // The reference script's output; the test fails if it does.
  std::string Reference(const std::string& args) {
    std::string out;
    const std::string command =
        absl::StrCat(python_, " ", TRAINSTEP_CONFORMANCE_DIR, "/llama_reference.py ", args);
    EXPECT_EQ(RunCommand(command, &out), 0) << command << "\n" << out;
    return out;
  }

  // A random model in Hugging Face layout, written by the reference.
  std::string MakeModel(const std::string& name, const std::string& config,
                        const std::string& extra = "") {
    const std::string path = absl::StrCat(dir(), "/", name);
    Reference(absl::StrCat("make ", path, " --seed 3 --config '", config, "' ", extra));
    return path;
  }

  std::string python_;

  JobConfig Job(const std::string& model_dir, int workers, int k, int micro_batch) {
    const std::string data = dir() + "/train.jsonl";
    if (!fs::exists(data)) WriteFile(data, kData);
    JobConfig c;
    c.model = absl::StrCat(R"({"llama":{"path":")", model_dir, R"("}})");
    c.data = absl::StrCat(R"({"jsonl":{"path":")", data, R"("}})");
    c.workers = workers;
    c.accumulation = k;
    c.micro_batch = micro_batch;
    c.epochs = 1;
    c.optimizer = R"({"sgd":{"lr":0.5}})";
    c.checkpoint_dir = absl::StrCat(dir(), "/ckpt-w", workers, "-k", k, "-",
                                    fs::path(model_dir).filename().string());
    return c;
  }

  // Runs `c` (one window; worker i with worker_flags[i]) and checks every tensor of its
  // checkpoint against the reference's one SGD step over the same four samples:
  // max|Δ| / max|reference| ≤ tolerance, and the logged loss equal to the reference's token mean.
  void ExpectOneWindowEqualsReference(
      const JobConfig& c, const std::string& model_dir,
      const std::vector<std::vector<std::string>>& worker_flags = {},
      double tolerance = kTolerance) {
    const std::string expected_path = c.checkpoint_dir + "-reference.safetensors";
    const std::string stats = Reference(absl::StrCat(
        "step ", model_dir, " --data ", dir(), "/train.jsonl --lr 0.5 --out ", expected_path));
    JobRun run = RunJob(c.Json(), c.workers, worker_flags);
    ASSERT_EQ(run.job.state(), v1::SUCCEEDED) << run.job.message() << "\n" << cluster()->Logs();
    const std::vector<v1::UpdateRecord> commits = Commits(run.updates);
    ASSERT_EQ(commits.size(), 1u);
    const size_t at = stats.find("\"loss\": ");
    ASSERT_NE(at, std::string::npos) << stats;
    const double loss = std::stod(stats.substr(at + 8));
    EXPECT_NEAR(commits[0].loss(), loss, tolerance * std::fabs(loss));

    absl::StatusOr<Params> trained = LatestCheckpointParams(c.checkpoint_dir);
    ASSERT_TRUE(trained.ok()) << trained.status();
    absl::StatusOr<Params> expected = SafetensorsParams(expected_path);
    ASSERT_TRUE(expected.ok()) << expected.status();
    absl::StatusOr<Params> initial = SafetensorsParams(model_dir + "/model.safetensors");
    ASSERT_EQ(trained->values.size(), expected->values.size());
    for (const auto& [name, values] : expected->values) {
      const double diff = RelativeDifference(Select(*trained, {name}), Select(*expected, {name}));
      EXPECT_LE(diff, tolerance) << name << " (W=" << c.workers << ", K=" << c.accumulation << ")";
      // The window moved every tensor well beyond the tolerance (norm weights near 1 least, by
      // ~6e-4): equality above means something.
      if (initial.ok()) {
        EXPECT_GT(RelativeDifference(Select(*initial, {name}), Select(*expected, {name})),
                  20 * tolerance)
            << name;
      }
    }
  }
};

// Catches a Llama forward that differs from the published one: the rotary convention
// (rotate-half, not interleaved pairs), theta, the KV-head grouping, RMSNorm's fp32 step, the
// 1/√head_dim scale, the causal mask, SwiGLU's order, the biases, the tied head.
TEST_F(LlamaTest, LogitsEqualIndependentReference) {
  const std::vector<std::vector<int64_t>> ids = {{3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8},
                                                 {60, 0, 59, 1, 58, 2, 57, 3, 56, 4, 55, 5}};
  const std::string ids_json = "[[3,1,4,1,5,9,2,6,5,3,5,8],[60,0,59,1,58,2,57,3,56,4,55,5]]";
  for (const auto& [name, config, extra] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"llama", kLlamaConfig, ""},
           {"qwen2-bf16-sharded", kQwen2Config, "--dtype bfloat16 --shard-bytes 4000"}}) {
    SCOPED_TRACE(name);
    const std::string model = MakeModel(name, config, extra);
    const std::string out = absl::StrCat(dir(), "/", name, "-logits.safetensors");
    Reference(absl::StrCat("logits ", model, " --ids '", ids_json, "' --out ", out));
    absl::StatusOr<Params> expected = SafetensorsParams(out);
    ASSERT_TRUE(expected.ok()) << expected.status();
    JobConfig c = Job(model, 1, 1, 1);
    absl::StatusOr<Params> logits = ModelLogits(c.Json(), ids);
    ASSERT_TRUE(logits.ok()) << logits.status();
    EXPECT_LE(RelativeDifference(*logits, *expected), kTolerance);
  }
}

// Catches gradients that differ from the architecture's (a wrong backward through the rotary
// or the grouped heads), and token weighting or the all-reduce going wrong for this model:
// one window at W = 1 (K = 2) and at W = 2 (K = 1) equals one plain SGD step of the reference.
TEST_F(LlamaTest, OneWindowEqualsReferenceAtOneAndTwoWorkers) {
  const std::string model = MakeModel("llama", kLlamaConfig);
  ExpectOneWindowEqualsReference(Job(model, 1, 2, 2), model);
  ExpectOneWindowEqualsReference(Job(model, 2, 1, 2), model);
}

// The same for the Qwen2 variant, from a sharded bf16 directory (widened to fp32 masters; the
// reference reads the same bf16 values): biases and the tied head get their gradients.
TEST_F(LlamaTest, Qwen2WindowEqualsReferenceAtTwoWorkers) {
  const std::string model = MakeModel("qwen2", kQwen2Config, "--dtype bfloat16 --shard-bytes 4000");
  ExpectOneWindowEqualsReference(Job(model, 2, 2, 1), model);
}

// Catches activation checkpointing that changes the result: a recomputation that sees other
// inputs, drops a parameter's gradient, or adds it twice.
TEST_F(LlamaTest, ActivationCheckpointingGivesTheSameWindow) {
  const std::string model = MakeModel("qwen2-ckpt", kQwen2Config);
  JobConfig c = Job(model, 2, 2, 1);
  c.model = absl::StrCat(R"({"llama":{"path":")", model, R"("},"activation_checkpointing":true})");
  ExpectOneWindowEqualsReference(c, model);
}

// On a GPU (scripts/gpu-check.sh runs it there): the same window on CUDA workers, fp32, with
// activation checkpointing; cuBLAS sums in other orders, hence the looser bound.
TEST_F(LlamaTest, CudaWindowEqualsReference) {
  const int gpus = WorkerCudaDevices();
  if (gpus == 0) GTEST_SKIP() << "no CUDA device visible to a CUDA-built worker";
  const std::string model = MakeModel("qwen2-cuda", kQwen2Config, "--dtype bfloat16");
  const int workers = std::min(gpus, 2);
  JobConfig c = Job(model, workers, workers == 2 ? 1 : 2, 2);
  c.model = absl::StrCat(R"({"llama":{"path":")", model, R"("},"activation_checkpointing":true})");
  std::vector<std::vector<std::string>> flags;
  for (int i = 0; i < workers; ++i) flags.push_back({absl::StrCat("--device=cuda:", i)});
  ExpectOneWindowEqualsReference(c, model, flags, 1e-4);
}

// Catches model.init_from ignored, half applied, or carrying the old job's ids: a job started
// from another's checkpoint, with an update below half an ulp of every weight, checkpoints
// exactly that checkpoint's weights at its own update 1. A checkpoint of another shape fails
// the job before its first window, naming the tensor.
TEST_F(LlamaTest, InitFromStartsFromACheckpointsWeights) {
  const std::string model = MakeModel("llama-init", kLlamaConfig);
  JobConfig first = Job(model, 1, 1, 4);
  JobRun run = RunJob(first);
  ASSERT_EQ(run.job.state(), v1::SUCCEEDED) << run.job.message() << "\n" << cluster()->Logs();
  const std::string trained = first.checkpoint_dir + "/ckpt-1";

  JobConfig second = Job(model, 1, 1, 4);
  second.checkpoint_dir = dir() + "/ckpt-second";
  second.model =
      absl::StrCat(R"({"llama":{"path":")", model, R"("},"init_from":")", trained, R"("})");
  second.optimizer = R"({"sgd":{"lr":1e-30}})";
  run = RunJob(second);
  ASSERT_EQ(run.job.state(), v1::SUCCEEDED) << run.job.message() << "\n" << cluster()->Logs();
  ASSERT_EQ(Commits(run.updates).size(), 1u);
  EXPECT_EQ(Commits(run.updates)[0].optimizer_update_id(), 1);
  absl::StatusOr<std::map<std::string, std::string>> from = TensorBytes(trained);
  absl::StatusOr<std::map<std::string, std::string>> to =
      TensorBytes(second.checkpoint_dir + "/ckpt-1");
  ASSERT_TRUE(from.ok() && to.ok());
  EXPECT_TRUE(*from == *to) << "the second job did not start from the first one's weights";
  absl::StatusOr<std::map<std::string, std::string>> initial = TensorBytes(model);
  ASSERT_TRUE(initial.ok());
  EXPECT_FALSE(*initial == *to);

  // A checkpoint of a wider model.
  std::string config = kLlamaConfig;
  ReplaceOnce(config, "\"intermediate_size\":64", "\"intermediate_size\":96");
  const std::string wide = MakeModel("llama-wide", config);
  JobConfig bad = Job(model, 1, 1, 4);
  bad.checkpoint_dir = dir() + "/ckpt-bad";
  bad.model = absl::StrCat(R"({"llama":{"path":")", model, R"("},"init_from":")", wide, R"("})");
  run = RunJob(bad);
  EXPECT_EQ(run.job.state(), v1::FAILED);
  EXPECT_NE(run.job.message().find("model.init_from: tensor 'model.layers.0.mlp.gate_proj.weight'"),
            std::string::npos)
      << run.job.message();
  EXPECT_NE(run.job.message().find("has shape [96, 32], but the model's is [64, 32]"),
            std::string::npos)
      << run.job.message();
  EXPECT_TRUE(Commits(run.updates).empty());
}

// Catches a checkpoint that the ecosystem's tools cannot open, or an export that changes the
// weights it was given: a job whose one update is far below half an ulp of every weight (so the
// trained fp32 master weights are the loaded ones) checkpoints config.json (float32, from
// bfloat16) beside the weights, records the config the worker read in the job, and
// `trainstep checkpoint export` in the input's dtype (its default) gives back the input
// directory's tensors byte for byte, sharded from a single file.
TEST_F(LlamaTest, CheckpointIsAHuggingFaceDirectoryAndExportGivesBackTheInput) {
  const std::string model = MakeModel("qwen2-bf16", kQwen2Config, "--dtype bfloat16");
  JobConfig c = Job(model, 1, 1, 4);
  c.optimizer = R"({"sgd":{"lr":1e-30}})";
  JobRun run = RunJob(c);
  ASSERT_EQ(run.job.state(), v1::SUCCEEDED) << run.job.message() << "\n" << cluster()->Logs();
  ASSERT_EQ(Commits(run.updates).size(), 1u);
  const auto& recorded = run.job.model_config().fields();
  ASSERT_TRUE(recorded.contains("hidden_size")) << run.job.DebugString();
  EXPECT_EQ(recorded.at("hidden_size").number_value(), 32);
  EXPECT_EQ(recorded.at("model_type").string_value(), "qwen2");
  EXPECT_EQ(recorded.at("trainstep_source_dtype").string_value(), "bfloat16");

  const std::string ckpt = c.checkpoint_dir + "/ckpt-1";
  const std::string config_json = testing::ReadFile(ckpt + "/config.json");
  EXPECT_NE(config_json.find("\"torch_dtype\": \"float32\""), std::string::npos) << config_json;
  EXPECT_NE(config_json.find("\"trainstep_source_dtype\": \"bfloat16\""), std::string::npos)
      << config_json;
  EXPECT_NE(config_json.find("\"Qwen2ForCausalLM\""), std::string::npos) << config_json;

  const std::string exported = dir() + "/exported";
  std::string out;
  const std::string command = absl::StrCat(testing::BinDir(), "/trainstep checkpoint export ", ckpt,
                                           " --out ", exported, " --max-shard-size 4000");
  ASSERT_EQ(RunCommand(command, &out), 0) << command << "\n" << out;
  EXPECT_TRUE(fs::exists(exported + "/model.safetensors.index.json")) << out;
  const std::string exported_config = testing::ReadFile(exported + "/config.json");
  EXPECT_NE(exported_config.find("\"torch_dtype\": \"bfloat16\""), std::string::npos)
      << exported_config;
  EXPECT_EQ(exported_config.find("trainstep_source_dtype"), std::string::npos) << exported_config;

  absl::StatusOr<std::map<std::string, std::string>> input = TensorBytes(model);
  ASSERT_TRUE(input.ok()) << input.status();
  absl::StatusOr<std::map<std::string, std::string>> output = TensorBytes(exported);
  ASSERT_TRUE(output.ok()) << output.status();
  ASSERT_EQ(input->size(), output->size());
  for (const auto& [name, bytes] : *input) {
    ASSERT_TRUE(output->count(name)) << name;
    EXPECT_TRUE(output->at(name) == bytes) << name << " differs after the round trip";
  }
  // The exported directory is a model like the input: the reference computes from it.
  const std::string ids = "[[1, 2, 3, 4, 5]]";
  Reference(absl::StrCat("logits ", exported, " --ids '", ids, "' --out ", dir(),
                         "/exported-logits.safetensors"));
  Reference(absl::StrCat("logits ", model, " --ids '", ids, "' --out ", dir(),
                         "/input-logits.safetensors"));
  EXPECT_EQ(testing::ReadFile(dir() + "/exported-logits.safetensors"),
            testing::ReadFile(dir() + "/input-logits.safetensors"));
}

// Catches a bad model directory half-loaded or trained on: each fails the job before its first
// window, with a message naming the field, the file and what is wrong.
TEST_F(LlamaTest, BadDirectoriesFailTheJobBeforeAnyWindow) {
  auto expect_fails = [&](const std::string& model, const std::string& says,
                          const std::vector<std::string>& flags = {}) {
    SCOPED_TRACE(says);
    JobConfig c = Job(model, 1, 1, 4);
    JobRun run = RunJob(c.Json(), 1, {flags});
    EXPECT_EQ(run.job.state(), v1::FAILED);
    EXPECT_NE(run.job.message().find("model.llama.path"), std::string::npos) << run.job.message();
    EXPECT_NE(run.job.message().find(says), std::string::npos) << run.job.message();
    EXPECT_TRUE(Commits(run.updates).empty());
    EXPECT_FALSE(fs::exists(c.checkpoint_dir + "/ckpt-1"));
  };
  const std::string sharded = MakeModel("sharded", kLlamaConfig, "--shard-bytes 8192");
  std::vector<std::string> shards;
  for (const auto& entry : fs::directory_iterator(sharded)) {
    if (entry.path().extension() == ".safetensors") shards.push_back(entry.path().string());
  }
  ASSERT_GE(shards.size(), 3u);
  std::sort(shards.begin(), shards.end());
  ASSERT_TRUE(fs::remove(shards[1]));
  expect_fails(sharded, shards[1] + " does not exist");

  const std::string truncated = MakeModel("truncated", kLlamaConfig);
  fs::resize_file(truncated + "/model.safetensors",
                  fs::file_size(truncated + "/model.safetensors") / 2);
  expect_fails(truncated, truncated + "/model.safetensors");

  // A config whose MLP is wider than the file's tensors.
  const std::string shape = MakeModel("shape", kLlamaConfig);
  std::string config = kLlamaConfig;
  ReplaceOnce(config, "\"intermediate_size\":64", "\"intermediate_size\":96");
  WriteFile(shape + "/config.json", config);
  expect_fails(shape, "has shape [64, 32], but config.json makes it [96, 32]");

  const std::string typed = MakeModel("typed", kLlamaConfig);
  config = kLlamaConfig;
  ReplaceOnce(config, "\"hidden_size\":32", "\"hidden_size\":\"32\"");
  WriteFile(typed + "/config.json", config);
  expect_fails(typed, "hidden_size must be an integer");

  // Outside the worker's roots: not one byte of the directory is read.
  const std::string roots = dir() + "/roots";
  fs::create_directories(roots);
  fs::copy(dir() + "/train.jsonl", roots + "/train.jsonl");
  const std::string outside = MakeModel("outside", kLlamaConfig);
  JobConfig c = Job(outside, 1, 1, 4);
  c.data = absl::StrCat(R"({"jsonl":{"path":")", roots, R"(/train.jsonl"}})");
  c.checkpoint_dir = roots + "/ckpt";
  JobRun run = RunJob(c.Json(), 1, {{"--allowed-roots", roots}});
  EXPECT_EQ(run.job.state(), v1::FAILED);
  EXPECT_NE(run.job.message().find("model.llama.path: " + outside), std::string::npos)
      << run.job.message();
  EXPECT_TRUE(Commits(run.updates).empty());
}

}  // namespace
}  // namespace trainstep::conformance
