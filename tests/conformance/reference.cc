#include "tests/conformance/reference.h"

#include <torch/torch.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/spec.h"
#include "core/window_plan.h"
#include "worker/checkpoint/checkpoint_dir.h"
#include "worker/data/collate.h"
#include "worker/data/dataset.h"
#include "worker/models/model.h"

namespace trainstep::conformance {
namespace {

void Put(Params& out, const std::string& name, const at::Tensor& t) {
  at::Tensor c = t.detach().to(at::kFloat).contiguous().cpu();
  std::vector<float> v(static_cast<size_t>(c.numel()));
  if (!v.empty()) std::memcpy(v.data(), c.data_ptr<float>(), v.size() * sizeof(float));
  out.values[name] = std::move(v);
  out.shapes[name] = c.sizes().vec();
}

Params Snapshot(Model& model) {
  Params p;
  for (const auto& [name, t] : model.NamedParameters()) Put(p, name, t);
  return p;
}

double LrFactor(const v1::Schedule& s, int64_t step) {
  const v1::WarmupDecay* d = nullptr;
  bool cosine = false;
  if (s.has_warmup_cosine()) {
    d = &s.warmup_cosine();
    cosine = true;
  } else if (s.has_warmup_linear()) {
    d = &s.warmup_linear();
  } else {
    return 1.0;
  }
  const double w = static_cast<double>(d->warmup_updates());
  const double t = static_cast<double>(d->total_updates());
  if (static_cast<double>(step) < w) return (static_cast<double>(step) + 1.0) / w;
  double p = t - w <= 0 ? 1.0 : (static_cast<double>(step) - w) / (t - w);
  p = std::min(1.0, std::max(0.0, p));
  const double m = d->min_lr_ratio();
  return cosine ? m + (1.0 - m) * 0.5 * (1.0 + std::cos(M_PI * p)) : m + (1.0 - m) * (1.0 - p);
}

// The parameter's group: the longest matching param_groups prefix (0 = default group).
int GroupOf(const v1::Optimizer& o, const std::string& name) {
  int group = 0;
  size_t best = 0;
  for (int i = 0; i < o.param_groups_size(); ++i) {
    const std::string& prefix = o.param_groups(i).prefix();
    if (absl::StartsWith(name, prefix) && prefix.size() > best) {
      best = prefix.size();
      group = i + 1;
    }
  }
  return group;
}

absl::StatusOr<ReferenceRun> RunOrThrow(const std::string& spec_json,
                                        const ReferenceOptions& options) {
  absl::StatusOr<v1::JobSpec> parsed = ParseAndResolveJobSpec(spec_json);
  if (!parsed.ok()) return parsed.status();
  v1::JobSpec spec = *parsed;
  // As the worker: the model first, its vocabulary then checks the data's ids.
  absl::StatusOr<std::unique_ptr<Model>> built = BuildModel(spec);
  if (!built.ok()) return built.status();
  Model& model = **built;
  RecordModelVocabulary(model, spec);
  absl::StatusOr<data::Dataset> dataset = data::Dataset::Load(spec);
  if (!dataset.ok()) return dataset.status();
  const WindowPlanner planner(spec, dataset->size());
  model.SetTraining(true);
  const bool token_level = dataset->token_level();

  // Frozen prefixes and param groups, decided from the spec here, not by the worker's Optim.
  const v1::Optimizer& o = spec.optimizer();
  std::vector<at::Tensor> trainable;
  std::vector<std::vector<at::Tensor>> members(o.param_groups_size() + 1);
  for (auto& [name, t] : model.NamedParameters()) {
    bool frozen = !t.requires_grad();
    for (const std::string& prefix : o.frozen_prefixes()) frozen |= absl::StartsWith(name, prefix);
    if (frozen) {
      t.set_requires_grad(false);
      continue;
    }
    trainable.push_back(t);
    members[GroupOf(o, name)].push_back(t);
  }
  std::vector<double> scales;
  std::vector<torch::optim::OptimizerParamGroup> groups;
  for (size_t g = 0; g < members.size(); ++g) {
    if (members[g].empty()) continue;
    const double scale = g == 0 ? 1.0 : o.param_groups(static_cast<int>(g) - 1).lr_scale();
    scales.push_back(scale);
    if (o.has_sgd()) {
      auto opts = std::make_unique<torch::optim::SGDOptions>(o.sgd().lr() * scale);
      opts->momentum(o.sgd().momentum()).weight_decay(o.sgd().weight_decay());
      groups.emplace_back(members[g], std::move(opts));
    } else {
      auto opts = std::make_unique<torch::optim::AdamWOptions>(o.adamw().lr() * scale);
      opts->betas({o.adamw().beta1(), o.adamw().beta2()})
          .eps(o.adamw().eps())
          .weight_decay(o.adamw().weight_decay());
      groups.emplace_back(members[g], std::move(opts));
    }
  }
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  if (o.has_sgd()) {
    optimizer = std::make_unique<torch::optim::SGD>(groups, torch::optim::SGDOptions(o.sgd().lr()));
  } else {
    optimizer = std::make_unique<torch::optim::AdamW>(groups);
  }
  const double base_lr = o.has_sgd() ? o.sgd().lr() : o.adamw().lr();
  const bool clip = spec.clip().has_max_grad_norm();
  const double max_norm =
      clip ? spec.clip().max_grad_norm() : std::numeric_limits<double>::infinity();

  ReferenceRun run;
  run.initial = Snapshot(model);
  const int64_t total_windows =
      spec.stop().has_epochs() ? planner.windows_per_epoch() * spec.stop().epochs() : -1;
  int64_t step = 0;
  for (int64_t w = 1;; ++w) {
    if (total_windows >= 0 && w > total_windows) break;
    if (spec.stop().has_max_updates() && step >= spec.stop().max_updates()) break;
    if (total_windows < 0 && w > 100000) return absl::InternalError("reference does not stop");
    const std::vector<int64_t> samples = planner.WindowSamples(w);
    const data::MicroBatch all = data::Collate(*dataset, samples);
    const int64_t units = token_level ? all.valid_tokens : all.samples;
    if (units == 0) {
      run.empty_windows.push_back(w);
      continue;
    }
    if (options.skip_windows.count(w)) continue;

    optimizer->zero_grad();
    at::Tensor loss;
    if (token_level) {
      at::Tensor ids = torch::tensor(all.input_ids, torch::kLong).view({all.rows, all.length});
      at::Tensor labels = torch::tensor(all.labels, torch::kLong).view({all.rows, all.length});
      at::Tensor logits = model.Forward(ids);
      const int64_t vocab = logits.size(2);
      // Causal LM: position t predicts token t + 1; the mean is over every valid token of
      // the whole window at once.
      at::Tensor lg = logits.slice(1, 0, all.length - 1).reshape({-1, vocab});
      at::Tensor lb = labels.slice(1, 1, all.length).reshape({-1});
      loss = torch::nn::functional::cross_entropy(
          lg, lb,
          torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-100).reduction(
              torch::kMean));
    } else {
      at::Tensor x = torch::tensor(all.features, torch::kFloat).view({all.rows, all.feature_dim});
      at::Tensor y = torch::tensor(all.targets, torch::kFloat).view({all.rows, all.target_dim});
      loss = torch::mse_loss(model.Forward(x), y);  // mean over samples (and outputs)
    }
    loss.backward();
    ReferenceUpdate u;
    u.window_id = w;
    u.units = units;
    u.loss = loss.item<double>();
    u.grad_norm = torch::nn::utils::clip_grad_norm_(trainable, max_norm);
    u.clip_coef = clip ? std::min(1.0, max_norm / (u.grad_norm + 1e-6)) : 1.0;
    u.learning_rate = base_lr * LrFactor(spec.schedule(), step);
    auto& pg = optimizer->param_groups();
    for (size_t g = 0; g < pg.size(); ++g) pg[g].options().set_lr(u.learning_rate * scales[g]);
    optimizer->step();
    ++step;
    run.updates.push_back(u);
    run.after_update.push_back(Snapshot(model));
  }
  run.final_params = Snapshot(model);
  return run;
}

absl::StatusOr<Params> FromCheckpoint(const std::string& dir, int64_t id, int64_t* update_id) {
  absl::StatusOr<ckpt::LoadedCheckpoint> c = ckpt::ReadCheckpoint(dir, id);
  if (!c.ok()) return c.status();
  Params p;
  for (const auto& [name, t] : c->model) Put(p, name, t);
  if (update_id != nullptr) *update_id = c->meta.optimizer_update_id;
  return p;
}

absl::StatusOr<Params> LogitsOrThrow(const std::string& spec_json,
                                     const std::vector<std::vector<int64_t>>& ids) {
  absl::StatusOr<v1::JobSpec> spec = ParseAndResolveJobSpec(spec_json);
  if (!spec.ok()) return spec.status();
  absl::StatusOr<std::unique_ptr<Model>> model = BuildModel(*spec);
  if (!model.ok()) return model.status();
  if (ids.empty()) return absl::InvalidArgumentError("no token ids");
  at::Tensor input =
      at::empty({static_cast<int64_t>(ids.size()), static_cast<int64_t>(ids[0].size())},
                at::TensorOptions().dtype(at::kLong));
  for (size_t b = 0; b < ids.size(); ++b) {
    if (ids[b].size() != ids[0].size()) return absl::InvalidArgumentError("ragged token ids");
    for (size_t t = 0; t < ids[b].size(); ++t) {
      input[static_cast<int64_t>(b)][static_cast<int64_t>(t)] = ids[b][t];
    }
  }
  torch::NoGradGuard no_grad;
  (*model)->SetTraining(false);
  Params p;
  Put(p, "logits", (*model)->Forward(input));
  return p;
}

absl::StatusOr<ReferenceEval> EvalOrThrow(const std::string& spec_json, const Params& params) {
  absl::StatusOr<v1::JobSpec> parsed = ParseAndResolveJobSpec(spec_json);
  if (!parsed.ok()) return parsed.status();
  v1::JobSpec spec = *parsed;
  if (!spec.has_eval()) return absl::InvalidArgumentError("the spec has no eval");
  absl::StatusOr<std::unique_ptr<Model>> built = BuildModel(spec);
  if (!built.ok()) return built.status();
  Model& model = **built;
  RecordModelVocabulary(model, spec);
  model.SetTraining(false);
  torch::NoGradGuard no_grad;
  NamedTensors all = model.NamedParameters();
  for (auto& b : model.NamedBuffers()) all.push_back(b);
  for (auto& [name, t] : all) {
    auto it = params.values.find(name);
    if (it == params.values.end()) return absl::NotFoundError(absl::StrCat("no tensor ", name));
    at::Tensor src = torch::from_blob(const_cast<float*>(it->second.data()), params.shapes.at(name),
                                      torch::kFloat);
    t.copy_(src);
  }
  *spec.mutable_data() = spec.eval().data();
  absl::StatusOr<data::Dataset> held_out = data::Dataset::Load(spec);
  if (!held_out.ok()) return held_out.status();
  if (!held_out->token_level()) return absl::InvalidArgumentError("token-level data only");
  const int64_t mb = spec.batch().micro_batch_size();
  int64_t n = held_out->size();
  if (spec.eval().has_max_batches()) n = std::min(n, spec.eval().max_batches() * mb);
  ReferenceEval out;
  double sum = 0.0, micro_sum = 0.0, means = 0.0;
  int64_t micro_tokens = 0, micro_batches = 0;
  for (int64_t i = 0; i < n; ++i) {
    const data::Sample s = held_out->at(i);
    const int64_t len = static_cast<int64_t>(s.input_ids.size());
    at::Tensor ids = torch::tensor(s.input_ids, torch::kLong).view({1, len});
    at::Tensor labels = torch::tensor(s.labels, torch::kLong);
    at::Tensor logits = model.Forward(ids)[0];
    at::Tensor l = torch::nn::functional::cross_entropy(
        logits.slice(0, 0, len - 1), labels.slice(0, 1, len),
        torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-100).reduction(torch::kSum));
    const int64_t tokens = labels.slice(0, 1, len).ne(-100).sum().item<int64_t>();
    sum += l.item<double>();
    out.tokens += tokens;
    micro_sum += l.item<double>();
    micro_tokens += tokens;
    if ((i + 1) % mb == 0 || i + 1 == n) {
      if (micro_tokens > 0) means += micro_sum / static_cast<double>(micro_tokens);
      ++micro_batches;
      micro_sum = 0.0;
      micro_tokens = 0;
    }
  }
  out.loss = sum / static_cast<double>(out.tokens);
  out.mean_of_micro_batch_means = means / static_cast<double>(micro_batches);
  return out;
}

}  // namespace

absl::StatusOr<ReferenceRun> RunReference(const std::string& spec_json,
                                          const ReferenceOptions& options) {
  try {
    return RunOrThrow(spec_json, options);
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("reference loop: ", e.what()));
  }
}

absl::StatusOr<ReferenceEval> ReferenceEvalLoss(const std::string& spec_json,
                                                const Params& params) {
  try {
    return EvalOrThrow(spec_json, params);
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("reference eval: ", e.what()));
  }
}

absl::StatusOr<Params> SafetensorsParams(const std::string& path) {
  absl::StatusOr<ckpt::TensorMap> tensors = ckpt::ReadSafetensorsFile(path);
  if (!tensors.ok()) return tensors.status();
  Params p;
  for (const auto& [name, t] : *tensors) Put(p, name, t);
  return p;
}

absl::StatusOr<Params> ModelLogits(const std::string& spec_json,
                                   const std::vector<std::vector<int64_t>>& ids) {
  try {
    return LogitsOrThrow(spec_json, ids);
  } catch (const std::exception& e) {
    return absl::InternalError(e.what());
  }
}

absl::StatusOr<Params> CheckpointParams(const std::string& dir, int64_t checkpoint_id,
                                        int64_t* optimizer_update_id) {
  return FromCheckpoint(dir, checkpoint_id, optimizer_update_id);
}

absl::StatusOr<Params> LatestCheckpointParams(const std::string& dir, int64_t* optimizer_update_id,
                                              int64_t* checkpoint_id) {
  absl::StatusOr<std::optional<int64_t>> latest = ckpt::LatestCheckpoint(dir);
  if (!latest.ok()) return latest.status();
  if (!latest->has_value()) return absl::NotFoundError(absl::StrCat("no checkpoint in ", dir));
  if (checkpoint_id != nullptr) *checkpoint_id = **latest;
  return FromCheckpoint(dir, **latest, optimizer_update_id);
}

double ReferenceLrFactor(const std::string& spec_json, int64_t scheduler_step) {
  absl::StatusOr<v1::JobSpec> spec = ParseAndResolveJobSpec(spec_json);
  if (!spec.ok()) return NAN;
  return LrFactor(spec->schedule(), scheduler_step);
}

int WorkerCudaDevices() {
#ifdef TRAINSTEP_WITH_CUDA
  return static_cast<int>(torch::cuda::device_count());
#else
  return 0;
#endif
}

}  // namespace trainstep::conformance
