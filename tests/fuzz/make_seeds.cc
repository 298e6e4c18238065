// Writes the seed corpora of tests/fuzz/corpus/ with the project's own writers, so the fuzzers
// start from real files: a journal the coordinator's Journal wrote for a job run by the real
// step machine (log, snapshot, snapshot + log, a format-1 log, a torn tail), its records for
// replay, step-machine programs that train small jobs to the end, a meta.json, safetensors
// files from our writer (worker builds only), and JSONL/text data wrapped for the dataset
// target. Run by tests/fuzz/make_seeds.sh; the output is committed.
//
//   trainstep_fuzz_seeds OUT_DIR JSONL_FILE TEXT_FILE
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/crc32c.h"
#include "coordinator/journal.h"
#include "core/spec.h"
#include "tests/unit/coordinator/fault_injection_env.h"
#include "tests/unit/coordinator/machine_test_util.h"
#include "worker/checkpoint/checkpoint_meta.h"
#ifdef TRAINSTEP_SEEDS_WITH_TORCH
#include <ATen/ATen.h>

#include "worker/checkpoint/safetensors.h"
#endif

namespace trainstep {
namespace {

namespace fs = std::filesystem;
using testing_util::RankReport;
using testing_util::SimulatedRanks;
using testing_util::SpecOptions;

std::string out_dir;

void Write(const std::string& target, const std::string& name, const std::string& bytes) {
  const fs::path dir = fs::path(out_dir) / target;
  fs::create_directories(dir);
  std::ofstream(dir / name, std::ios::binary) << bytes;
}

std::string Read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "cannot read %s\n", path.c_str());
    std::exit(1);
  }
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void Check(const absl::Status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    std::exit(1);
  }
}

void Put16(std::string* out, size_t n) {
  if (n > 0xFFFF) {
    std::fprintf(stderr, "a seed part of %zu bytes does not fit a 16-bit length\n", n);
    std::exit(1);
  }
  out->push_back(static_cast<char>(n & 0xFF));
  out->push_back(static_cast<char>(n >> 8));
}

void Put32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}

// --- A real job: its journal records, and snapshots of the registry along the way. -----------

struct Run {
  std::vector<std::string> records;  // serialized, in order
  std::string mid_snapshot;          // the registry after records[0, mid)
  size_t mid = 0;
  std::string final_snapshot;
  std::string spec_json;
};

Run RealJob() {
  SpecOptions o;
  o.workers = 2;
  o.precision = "fp16";
  o.loss_scaler = R"({"growth_interval":2})";
  o.max_updates = 5;
  o.checkpoint_dir = "/ckpt";
  o.every_updates = 2;
  o.max_grad_norm = 1.0;
  const v1::JobSpec spec = testing_util::ResolvedSpec(o);
  SimulatedRanks job(spec);
  job.Start(2);
  Check(job.Ack(0, 0));
  job.RunWindow();
  RankReport overflow;
  overflow.found_inf = true;
  job.RunWindow(overflow);
  job.RunWindow();
  Check(job.Ack(job.progress().checkpoint_id(), job.progress().optimizer_update_id()));
  Run run;
  run.mid = job.records().size();
  job.registry().Snapshot().SerializeToString(&run.mid_snapshot);
  job.Lose({job.Ranks().at(1)});  // A worker dies: its window is aborted, a generation forms.
  const std::string newcomer = job.AddWorker();
  (void)job.Heartbeat(newcomer);
  while (job.state() == v1::RUNNING && job.progress().optimizer_update_id() < 5) {
    job.RunWindow();
    // Only windows that assigned a checkpoint have one to acknowledge.
    (void)job.Ack(job.progress().checkpoint_id(), job.progress().optimizer_update_id()).ok();
  }
  for (const v1::JournalRecord& r : job.records()) run.records.push_back(r.SerializeAsString());
  job.registry().Snapshot().SerializeToString(&run.final_snapshot);
  run.spec_json = JobSpecToJson(spec, /*pretty=*/true);
  std::fprintf(stderr, "real job: %zu records, state %s, update %lld\n", run.records.size(),
               v1::JobState_Name(job.state()).c_str(),
               static_cast<long long>(job.progress().optimizer_update_id()));
  return run;
}

// The files the coordinator's Journal writes for `records` (after `snapshot`, if any).
std::map<std::string, std::string> JournalFiles(const std::optional<std::string>& snapshot,
                                                const std::vector<std::string>& records) {
  InMemoryEnv env;
  {
    std::unique_ptr<Journal> journal = *Journal::Open(&env, "/j", {}, nullptr);
    if (snapshot) Check(journal->WriteSnapshot(*snapshot));
    uint64_t seq = 0;
    for (const std::string& r : records) seq = journal->Append(r);
    if (seq > 0) Check(journal->Sync(seq));
  }
  std::map<std::string, std::string> files;
  const std::vector<std::string> names = *env.ListDir("/j");
  for (const std::string& name : names) files[name] = *env.Contents("/j/" + name);
  return files;
}

// Format 1 (no file header): length | masked CRC32C(payload) | payload.
std::string Format1Log(const std::vector<std::string>& records) {
  std::string log;
  for (const std::string& r : records) {
    Put32(&log, static_cast<uint32_t>(r.size()));
    Put32(&log, MaskCrc(Crc32c(r)));
    log += r;
  }
  return log;
}

void JournalSeeds(const Run& run) {
  const std::vector<std::string> first(run.records.begin(), run.records.begin() + run.mid);
  const std::vector<std::string> rest(run.records.begin() + run.mid, run.records.end());
  std::map<std::string, std::string> whole = JournalFiles(std::nullopt, run.records);
  Write("journal", "log", std::string(1, '\0') + whole.at("log-000001"));
  // A crash mid-append: the last record cut short.
  std::string torn = whole.at("log-000001");
  torn.resize(torn.size() - 7);
  Write("journal", "log_torn_tail", std::string(1, '\0') + torn);
  std::map<std::string, std::string> snap = JournalFiles(run.final_snapshot, {});
  Write("journal", "snapshot", std::string(1, '\1') + snap.at("snapshot-000002"));
  std::map<std::string, std::string> both = JournalFiles(run.mid_snapshot, rest);
  std::string two(1, '\2');
  Put16(&two, both.at("snapshot-000002").size());
  two += both.at("snapshot-000002") + both.at("log-000002");
  Write("journal", "snapshot_and_log", two);
  // A format-1 log (an older coordinator's) followed by the format-2 log Open starts after it.
  std::string upgrade(1, '\3');
  const std::string old_log = Format1Log(first);
  Put16(&upgrade, old_log.size());
  upgrade += old_log + JournalFiles(std::nullopt, rest).at("log-000001");
  Write("journal", "format1_then_format2", upgrade);

  // journal_replay: [has snapshot][len16 snapshot] then len16 + record, ...
  std::string replay(1, '\0');
  for (const std::string& r : run.records) {
    Put16(&replay, r.size());
    replay += r;
  }
  Write("journal_replay", "records", replay);
  std::string replay_snap(1, '\1');
  Put16(&replay_snap, run.mid_snapshot.size());
  replay_snap += run.mid_snapshot;
  for (const std::string& r : rest) {
    Put16(&replay_snap, r.size());
    replay_snap += r;
  }
  Write("journal_replay", "snapshot_and_records", replay_snap);
}

// --- Step-machine programs, in the layout step_machine_fuzz.cc reads. --------------------------

class Program {
 public:
  // knobs: 1 tail drop, 2 fp16, 4 clip, 8 max_updates (else epochs), 16 checkpoints.
  Program(uint8_t knobs, int accumulation, int workers, int growth, int stop, int every) {
    B(knobs);
    B(accumulation - 1);
    B(workers - 1);
    if (knobs & 2) B(growth - 1);
    B(stop - 1);
    if (knobs & 16) B(every - 1);
  }
  static constexpr uint8_t kProtocol = 2;
  void Register(int slot) { B(0), B(slot - 1), B(0), B(0); }
  void Heartbeat(int slot, bool dataset) {
    B(1), B(slot - 1), B(dataset);
    if (dataset) B(0);
    B(kProtocol);
  }
  void Begin(int slot) {
    B(2), B(slot - 1), B(kProtocol), B(kProtocol), B(kProtocol), B(kProtocol);
  }
  void Complete(int slot, bool found_inf = false) {
    B(3), B(slot - 1), B(kProtocol), B(kProtocol), B(kProtocol), B(kProtocol), B(kProtocol);
    B(found_inf ? 1 : 0), B(kProtocol), B(kProtocol), B(kProtocol);
  }
  void Ack(int slot) { B(4), B(slot - 1), B(kProtocol), B(kProtocol); }
  void Tick(uint8_t ms) { B(6), B(0), B(ms); }
  void LongTick(uint16_t ms) { B(6), B(1), B(ms & 0xFF), B(ms >> 8); }
  void Window(const std::vector<int>& slots, bool found_inf = false) {
    for (int s : slots) Begin(s);
    for (int s : slots) Complete(s, found_inf);
    for (int s : slots) Ack(s);
    Tick(50);
  }
  const std::string& bytes() const { return bytes_; }

 private:
  void B(int b) { bytes_.push_back(static_cast<char>(b)); }
  std::string bytes_;
};

void StepMachineSeeds() {
  {  // Two workers, fp16 with clipping, 5 updates, a checkpoint every 2, one overflow window.
    Program p(2 | 4 | 8 | 16, 1, 2, 2, 5, 2);
    for (int s : {1, 2}) p.Register(s);
    for (int s : {1, 2}) p.Heartbeat(s, true);
    for (int s : {1, 2}) p.Ack(s);
    for (int w = 0; w < 7; ++w) p.Window({1, 2}, w == 2);
    Write("step_machine", "two_workers_fp16_checkpoints", p.bytes());
  }
  {  // One worker, accumulation 2, one epoch of a dropped tail.
    Program p(1, 2, 1, 1, 2, 1);
    p.Register(1);
    p.Heartbeat(1, true);
    for (int w = 0; w < 13; ++w) p.Window({1});
    Write("step_machine", "one_worker_epoch", p.bytes());
  }
  {  // Three workers with checkpoints; one stops heartbeating and is lost, a fourth joins.
    Program p(8 | 16, 1, 3, 1, 6, 1);
    for (int s : {1, 2, 3}) p.Register(s);
    for (int s : {1, 2, 3}) p.Heartbeat(s, true);
    p.Ack(1);
    p.Window({1, 2, 3});
    p.Window({1, 2, 3});
    for (int i = 0; i < 4; ++i) {
      p.LongTick(3000);
      for (int s : {1, 2}) p.Heartbeat(s, false);
    }
    p.Register(4);
    p.Heartbeat(4, true);
    for (int s : {1, 2, 4}) p.Heartbeat(s, false);
    for (int w = 0; w < 6; ++w) p.Window({1, 2, 4});
    Write("step_machine", "lost_worker_and_newcomer", p.bytes());
  }
}

// --- Files a worker reads. ----------------------------------------------------------------------

void CheckpointMetaSeeds(const std::string& spec_hash) {
  ckpt::CheckpointMeta m;
  m.job_id = "job-1";
  m.checkpoint_id = 3;
  m.optimizer_update_id = 6;
  m.scheduler_step = 6;
  m.window_id = 7;
  m.epoch = 0;
  m.cumulative_tokens = 1234;
  m.loss_scale = 32768;
  m.scaler_growth_tracker = 1;
  m.spec_hash = spec_hash;
  m.next_window_id = 8;
  m.written_unix_ms = 1'700'000'000'123;
  Write("checkpoint_meta", "meta.json", *ckpt::CheckpointMetaToJson(m));
  m.cumulative_tokens = int64_t{1} << 60;  // Written as a decimal string.
  m.loss_scale = 0.1;
  Write("checkpoint_meta", "meta_big_ints.json", *ckpt::CheckpointMetaToJson(m));
  m.file_xxh64 = {{"model.safetensors", 0x0123456789abcdefu}, {"optimizer.safetensors", 42}};
  Write("checkpoint_meta", "meta_digests.json", *ckpt::CheckpointMetaToJson(m));
}

void SafetensorsSeeds() {
#ifdef TRAINSTEP_SEEDS_WITH_TORCH
  ckpt::TensorMap tensors = {
      {"embed.weight", at::arange(12, at::kFloat).reshape({3, 4})},
      {"head.bias", at::tensor({1.5, -2.0}, at::kDouble)},
      {"mask", at::tensor({1, 0, 1}, at::kInt).to(at::kBool)},
      {"half", at::ones({2}, at::kHalf)},
      {"bf16", at::ones({2}, at::kBFloat16)},
      {"step", at::tensor({7}, at::kInt).to(at::kLong)},
      {"empty", at::zeros({0, 3}, at::kInt)},
      {"scalar", at::scalar_tensor(3, at::kChar)},
  };
  Write("safetensors", "model.safetensors",
        *ckpt::SerializeSafetensors(tensors, {{"format", "pt"}}));
  Write("safetensors", "empty.safetensors", *ckpt::SerializeSafetensors({}, {}));
#else
  std::fprintf(stderr, "safetensors seeds need the worker build (LibTorch): skipped\n");
#endif
}

// [jsonl?][torchscript?][vocab16 if torchscript][seq_len - 2] + the file (dataset_fuzz.cc).
void DatasetSeeds(const std::string& jsonl, const std::string& text) {
  Write("dataset", "jsonl_tiny_gpt", std::string("\1\0\76", 3) + jsonl);
  Write("dataset", "jsonl_torchscript_vocab_200", std::string("\1\1\307\0\20", 5) + jsonl);
  Write("dataset", "text_tiny_gpt", std::string("\0\0\16", 3) + text);
  Write("dataset", "text_torchscript_vocab_128", std::string("\0\1\177\0\10", 5) + text);
}

}  // namespace
}  // namespace trainstep

int main(int argc, char** argv) {
  using namespace trainstep;
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s OUT_DIR JSONL_FILE TEXT_FILE\n", argv[0]);
    return 2;
  }
  out_dir = argv[1];
  const Run run = RealJob();
  JournalSeeds(run);
  StepMachineSeeds();
  Write("spec", "resolved_fp16_checkpoints.json", run.spec_json);
  CheckpointMetaSeeds(JobSpecHash(*ParseJobSpecJson(run.spec_json)));
  SafetensorsSeeds();
  DatasetSeeds(Read(argv[2]), Read(argv[3]));
  return 0;
}
