// Baseline (a) of the worker benchmark: a plain single-process LibTorch training loop over
// exactly the windows trainstep trains — the same resolved spec, the same tiny_gpt or llama
// (BuildModel), the same micro-batches (WindowPlanner + Collate, every rank's share in
// turn), forward / backward(Σ CE / N) / AdamW step, and nothing else: no coordinator, no
// collective, no unscale or norm. It takes the worker's malloc settings (malloc_config.h)
// unless --malloc default. One line of JSON per window goes to --out:
//   {"window": w, "end_time_ms": t, "tokens": N, "compute_seconds": c, "optimizer_seconds": o}
// tests/bench/worker/worker_bench.py turns them into tokens/s over the same window range
// as trainstep's updates.jsonl.
#include <ATen/Parallel.h>
#include <torch/autograd.h>
#include <torch/optim/adamw.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/env.h"
#include "common/flags.h"
#include "core/spec.h"
#include "core/window_plan.h"
#include "worker/data/collate.h"
#include "worker/data/dataset.h"
#include "worker/host/host_setup.h"
#include "worker/host/malloc_config.h"
#include "worker/models/model.h"
#include "worker/train/amp.h"

ABSL_FLAG(std::string, spec, "", "job spec (JSON), the one trainstep runs");
ABSL_FLAG(int64_t, windows, 0, "windows to train (default: the spec's stop.max_updates)");
ABSL_FLAG(int32_t, threads, 1,
          "compute threads (LibTorch intra-op and the BLAS), as the worker's --threads");
ABSL_FLAG(std::string, out, "", "per-window JSON lines go here (default: stdout)");
ABSL_FLAG(std::string, malloc, "worker",
          "worker: the trainstep worker's glibc malloc settings; default: glibc's defaults");

namespace trainstep {
namespace {

double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

int64_t UnixMillis() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

at::Tensor ToLongTensor(const std::vector<int64_t>& v, int64_t rows, int64_t cols) {
  return at::from_blob(const_cast<int64_t*>(v.data()), {rows, cols}, at::kLong).clone();
}

int Run(int argc, char** argv) {
  ConfigureUsage(
      "Plain LibTorch loop over a trainstep spec's windows (benchmark baseline).\n"
      "Usage: plain_loop_bench --spec SPEC.json [--windows N] [--threads 1] [--out FILE]");
  std::vector<char*> args;
  std::vector<std::string> storage = NormalizeFlagNames(argc, argv, &args);
  absl::ParseCommandLine(static_cast<int>(args.size()) - 1, args.data());

  const std::string malloc_mode = absl::GetFlag(FLAGS_malloc);
  if (malloc_mode == "worker") {
    if (!ConfigureMallocForTraining()) std::cerr << "plain_loop_bench: mallopt failed\n";
  } else if (malloc_mode != "default") {
    std::cerr << "--malloc must be worker or default\n";
    return 2;
  }
  const int default_threads = at::get_num_threads();
  // The worker's own thread setup (LibTorch and the BLAS's pool), so both run alike.
  absl::StatusOr<HostSetup> host = SetUpHost(absl::GetFlag(FLAGS_threads), "");
  if (!host.ok()) {
    std::cerr << host.status() << "\n";
    return 2;
  }

  absl::StatusOr<std::string> json = Env::Default()->ReadFile(absl::GetFlag(FLAGS_spec));
  if (!json.ok()) {
    std::cerr << json.status() << "\n";
    return 2;
  }
  absl::StatusOr<v1::JobSpec> spec = ParseAndResolveJobSpec(*json);
  if (!spec.ok()) {
    std::cerr << spec.status() << "\n";
    return 2;
  }
  if (!(spec->model().has_tiny_gpt() || spec->model().has_llama()) ||
      !spec->optimizer().has_adamw() || spec->precision() == v1::JobSpec::fp16) {
    std::cerr << "plain_loop_bench runs tiny_gpt or llama with AdamW in fp32 or bf16 only\n";
    return 2;
  }
  // The model first, as the worker builds it: llama's vocabulary comes from its config.json,
  // and the data's ids are checked against it.
  const auto build_start = std::chrono::steady_clock::now();
  absl::StatusOr<std::unique_ptr<Model>> model = BuildModel(*spec);
  if (!model.ok()) {
    std::cerr << model.status() << "\n";
    return 2;
  }
  const double build_seconds = Seconds(std::chrono::steady_clock::now() - build_start);
  RecordModelVocabulary(**model, *spec);
  absl::StatusOr<data::Dataset> dataset = data::Dataset::Load(*spec);
  if (!dataset.ok()) {
    std::cerr << dataset.status() << "\n";
    return 2;
  }
  WindowPlanner planner(*spec, dataset->size());
  const int world = spec->workers().count();
  int64_t windows = absl::GetFlag(FLAGS_windows);
  if (windows <= 0) windows = spec->stop().max_updates();
  if (windows <= 0) windows = planner.windows_per_epoch();

  (*model)->SetTraining(true);
  std::vector<at::Tensor> params;
  for (auto& [name, p] : (*model)->NamedParameters()) params.push_back(p);
  const v1::AdamW& a = spec->optimizer().adamw();
  torch::optim::AdamW optimizer(params, torch::optim::AdamWOptions(a.lr())
                                            .betas({a.beta1(), a.beta2()})
                                            .eps(a.eps())
                                            .weight_decay(a.weight_decay()));
  const bool bf16 = spec->precision() == v1::JobSpec::bf16;

  std::ofstream file;
  const std::string out_path = absl::GetFlag(FLAGS_out);
  if (!out_path.empty()) file.open(out_path);
  std::ostream& out = out_path.empty() ? std::cout : file;
  std::cerr << absl::StrFormat(
      "plain_loop_bench: %d windows of %d micro-batches x %d samples, %s, torch threads %d "
      "(default here %d), malloc %s, model built in %.2f s; %s\n",
      windows, world * spec->batch().accumulation_steps(), spec->batch().micro_batch_size(),
      bf16 ? "bf16" : "fp32", at::get_num_threads(), default_threads, malloc_mode, build_seconds,
      DescribeHost(*host));

  for (int64_t w = 1; w <= windows; ++w) {
    const auto start = std::chrono::steady_clock::now();
    // The window's micro-batches, every rank's share in turn: the work of all W workers.
    std::vector<std::vector<int64_t>> micro_batches;
    for (int r = 0; r < world; ++r) {
      for (auto& mb : planner.RankMicroBatches(w, r, world)) micro_batches.push_back(std::move(mb));
    }
    int64_t n = 0;
    for (const auto& mb : micro_batches) n += data::ValidTokens(*dataset, mb);
    at::Tensor loss_total = at::zeros({}, at::kFloat);
    for (const auto& indices : micro_batches) {
      const data::MicroBatch mb = data::Collate(*dataset, indices);
      at::Tensor input = ToLongTensor(mb.input_ids, mb.rows, mb.length);
      at::Tensor labels = ToLongTensor(mb.labels, mb.rows, mb.length);
      at::Tensor logits;
      {
        // The worker's scope (worker/train/amp.h): LibTorch's autocast switches differ by version.
        AutocastScope autocast(spec->precision(), at::kCPU);
        logits = (*model)->Forward(input);
      }
      const int64_t vocab = logits.size(2);
      at::Tensor loss = at::cross_entropy_loss(
          logits.narrow(1, 0, mb.length - 1).reshape({-1, vocab}).to(at::kFloat),
          labels.narrow(1, 1, mb.length - 1).reshape({-1}), /*weight=*/{}, at::Reduction::Sum,
          /*ignore_index=*/-100);
      torch::autograd::backward({loss / static_cast<double>(n)});
      loss_total += loss.detach();
    }
    const auto optimizer_start = std::chrono::steady_clock::now();
    optimizer.step();
    optimizer.zero_grad();
    const double loss = loss_total.item<double>() / static_cast<double>(n);
    const auto end = std::chrono::steady_clock::now();
    out << absl::StrFormat(
               "{\"window\": %d, \"end_time_ms\": %d, \"tokens\": %d, \"loss\": %.6f, "
               "\"compute_seconds\": %.6f, \"optimizer_seconds\": %.6f}",
               w, UnixMillis(), n, loss, Seconds(optimizer_start - start),
               Seconds(end - optimizer_start))
        << std::endl;
  }
  return 0;
}

}  // namespace
}  // namespace trainstep

int main(int argc, char** argv) {
  try {
    return trainstep::Run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "plain_loop_bench: " << e.what() << "\n";
    return 1;
  }
}
