// Fuzzes the coordinator's step machine (coordinator/step_machine.h) with a sequence of worker
// calls parsed from the input (Register, Heartbeat, BeginWindow, CompleteWindow with or without
// the next window's begin report riding on it, AckCheckpoint, ReportFailure (a checkpoint found
// damaged among them), Tick, Cancel) against a small job the input also picks. Fields are
// steered near the machine's current state (generation, window, rank) so that the protocol is
// actually followed, and sometimes taken raw.
// After every call it checks:
//   * the ids never decrease, except all together through a journaled rollback, and the
//     generation never decreases at all;
//   * optimizer_update_id and scheduler_step never exceed window_id;
//   * a replica fed only the journal records the machine emitted has the same snapshot (so a
//     restarted coordinator recovers exactly the machine that crashed);
//   * and, at the end, a machine restored from the snapshot has the same snapshot.
// Any crash or sanitizer report is a finding too.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "coordinator/step_machine.h"
#include "core/spec.h"
#include "tests/fuzz/fuzz_util.h"

namespace trainstep {
namespace {

using fuzz::DeterministicBytes;
using fuzz::FuzzInput;

constexpr int kMaxCalls = 400;
constexpr int kMaxWorkerSlots = 5;
// Valid units a correct worker reports for each window.
constexpr int64_t kUnits = 10;

// A resolved spec for a small job, with the knobs that change the protocol taken from `in`
// (read in a fixed order: tests/fuzz/make_seeds.cc writes inputs in this layout).
v1::JobSpec SmallJob(FuzzInput& in) {
  const uint8_t knobs = in.Byte();
  const int64_t accumulation = in.Range(1, 2);
  const int64_t workers = in.Range(1, 3);
  std::string json =
      absl::StrCat(R"({"name":"fuzz","model":{"tiny_gpt":{}},"data":{"text":{"paths":["/data"]}},)",
                   R"("batch":{"micro_batch_size":1,"accumulation_steps":)", accumulation,
                   R"(,"tail":")", (knobs & 1) ? "drop" : "dynamic",
                   R"("},"optimizer":{"sgd":{"lr":0.1}},)", R"("workers":{"count":)", workers, "}");
  if (knobs & 2) {
    const int64_t growth_interval = in.Range(1, 3);
    absl::StrAppend(&json, R"(,"precision":"fp16","loss_scaler":{"growth_interval":)",
                    growth_interval, "}");
  }
  if (knobs & 4) absl::StrAppend(&json, R"(,"clip":{"max_grad_norm":1.0})");
  const int64_t stop = in.Range(1, 6);
  if (knobs & 8) {
    absl::StrAppend(&json, R"(,"stop":{"max_updates":)", stop, "}");
  } else {
    absl::StrAppend(&json, R"(,"stop":{"epochs":)", stop > 3 ? 2 : 1, "}");
  }
  if (knobs & 16) {
    const int64_t every = in.Range(1, 3);
    absl::StrAppend(&json, R"(,"checkpoint":{"dir":"/ckpt","every_updates":)", every, "}");
  }
  absl::StrAppend(&json, "}");
  absl::StatusOr<v1::JobSpec> spec = ParseAndResolveJobSpec(json);
  FUZZ_CHECK(spec.ok(), spec.status().ToString() + "\n" + json);
  return *spec;
}

// The snapshot without what is deliberately not journaled (heartbeat times).
std::string Comparable(v1::JobSnapshot snap) {
  for (v1::WorkerSnapshot& w : *snap.mutable_workers()) w.mutable_info()->clear_last_heartbeat_ms();
  return DeterministicBytes(snap);
}

struct Ids {
  int64_t window = 0, update = 0, scheduler = 0, checkpoint = 0, generation = 0, tokens = 0;
};

Ids IdsOf(const StepMachine& m) {
  const v1::JobProgress p = m.Job().progress();
  return {p.window_id(),     p.optimizer_update_id(), p.scheduler_step(),
          p.checkpoint_id(), p.generation(),          p.cumulative_tokens()};
}

class Harness {
 public:
  Harness(FuzzInput& in) : in_(in) {
    v1::Job job;
    job.set_job_id("job-1");
    job.set_name("fuzz");
    job.set_state(v1::PENDING);
    *job.mutable_spec() = SmallJob(in);
    job.set_submit_time_ms(absl::ToUnixMillis(now_));
    machine_ = StepMachine::Create(options_, job, now_);
    std::vector<v1::JournalRecord> records = machine_->TakeRecords();
    FUZZ_CHECK(records.size() == 1 && records[0].has_job_submitted());
    replica_ = StepMachine::FromSubmitted(options_, records[0].job_submitted());
    replica_->Apply(records[0]);
    ids_ = IdsOf(*machine_);
  }

  void Run() {
    for (int call = 0; call < kMaxCalls && !in_.empty(); ++call) {
      Step();
      Check();
    }
    if (std::getenv("TRAINSTEP_FUZZ_VERBOSE") != nullptr) {  // To see where a seed leads.
      std::fprintf(stderr, "job %s, progress %s\n",
                   v1::JobState_Name(machine_->Job().state()).c_str(),
                   machine_->Job().progress().ShortDebugString().c_str());
    }
    // A restarted coordinator that snapshotted here recovers the same machine.
    const v1::JobSnapshot snap = machine_->Snapshot();
    std::unique_ptr<StepMachine> restored = StepMachine::Restore(options_, snap, now_);
    FUZZ_CHECK(Comparable(restored->Snapshot()) == Comparable(snap),
               "Restore(Snapshot()) differs:\n" + snap.DebugString());
  }

 private:
  // Every field is chosen by a selector byte: 0 = raw bytes from the input (anything at all),
  // 1 = a small value near the protocol's, 2..255 = what a correct worker sends (no more bytes).
  enum Choice { kRaw, kNear, kProtocol };
  Choice Select() { return static_cast<Choice>(std::min<uint8_t>(in_.Byte(), kProtocol)); }

  template <typename T>
  T Choose(T protocol, int64_t near_lo, int64_t near_hi) {
    switch (Select()) {
      case kRaw:
        return in_.Raw<T>();
      case kNear:
        return static_cast<T>(protocol + in_.Range(near_lo, near_hi));
      default:
        return protocol;
    }
  }
  double ChooseNumber(double protocol) {
    switch (Select()) {
      case kRaw:
        return in_.Raw<double>();  // NaN, infinities, negatives, denormals
      case kNear:
        return in_.Bool() ? std::numeric_limits<double>::infinity()
                          : static_cast<double>(in_.Range(0, 40)) / 8.0;
      default:
        return protocol;
    }
  }

  std::string Worker() { return absl::StrCat("worker-", in_.Range(1, kMaxWorkerSlots)); }
  v1::JobProgress Progress() const { return machine_->Job().progress(); }
  int64_t Generation() { return Choose<int64_t>(Progress().generation(), -1, 1); }
  int64_t Window() { return Choose<int64_t>(Progress().window_id() + 1, -1, 2); }
  int32_t Rank(const std::string& worker) {
    int32_t actual = -1;
    for (const v1::WorkerInfo& w : machine_->Workers()) {
      if (w.worker_id() == worker) actual = w.rank();
    }
    return Choose<int32_t>(actual, -1, 2);
  }

  void Step() {
    const uint8_t op = in_.Byte() % 9;
    switch (op) {
      case 0: {
        const std::string worker = Worker();
        v1::RegisterWorkerRequest req;
        req.set_job_id("job-1");
        req.set_name(in_.String(8));
        req.set_request_id(in_.String(4));
        (void)machine_->RegisterWorker(worker, req, now_);
        break;
      }
      case 1: {
        v1::HeartbeatRequest req;
        req.set_job_id("job-1");
        req.set_worker_id(Worker());
        if (in_.Bool()) {
          // Most workers read the same data; some read other data or absurd sizes.
          const uint8_t kind = in_.Byte();
          req.mutable_dataset()->set_samples(kind < 200 ? 24 : in_.Raw<int64_t>());
          req.mutable_dataset()->set_fingerprint(kind < 220 ? "0123456789abcdef" : in_.String(4));
        }
        req.set_applied_update_id(Choose<int64_t>(Progress().optimizer_update_id(), -1, 1));
        (void)machine_->Heartbeat(req, now_);
        break;
      }
      case 2: {
        v1::BeginWindowRequest req;
        req.set_job_id("job-1");
        req.set_worker_id(Worker());
        req.set_generation(Generation());
        req.set_window_id(Window());
        req.set_rank(Rank(req.worker_id()));
        req.set_valid_units(Choose<int64_t>(kUnits, -10, 10));
        (void)machine_->BeginWindow(req, now_);
        break;
      }
      case 3: {
        v1::CompleteWindowRequest req;
        req.set_job_id("job-1");
        req.set_worker_id(Worker());
        req.set_generation(Generation());
        req.set_window_id(Window());
        req.set_rank(Rank(req.worker_id()));
        req.set_loss_sum(ChooseNumber(kUnits * 2.5));
        req.set_valid_units(Choose<int64_t>(kUnits, -10, 10));
        // One byte: 1 = overflow; 2 and 3 also carry the next window's begin report (`next`),
        // 3 for a window it cannot be (refused). Read as before, so old inputs keep meaning.
        const uint8_t flags = in_.Byte();
        req.set_found_inf(flags == 1);
        if (flags == 2 || flags == 3) {
          v1::BeginWindowRequest* next = req.mutable_next();
          next->set_job_id(req.job_id());
          next->set_worker_id(req.worker_id());
          next->set_generation(req.generation());
          next->set_window_id(req.window_id() + (flags == 2 ? 1 : 2));
          next->set_rank(req.rank());
          next->set_valid_units(kUnits);
        }
        req.set_grad_norm(ChooseNumber(0.5));
        const int64_t accumulation = machine_->Job().spec().batch().accumulation_steps();
        req.set_micro_steps(Choose<int64_t>(accumulation, -1, 1));
        req.set_allreduce_calls(Choose<int64_t>(1, -1, 1));
        (void)machine_->CompleteWindow(req, now_);
        break;
      }
      case 4: {
        v1::AckCheckpointRequest req;
        req.set_job_id("job-1");
        req.set_worker_id(Worker());
        const v1::JobProgress p = Progress();
        req.set_checkpoint_id(Choose<int64_t>(p.checkpoint_id(), -1, 0));
        req.set_optimizer_update_id(Choose<int64_t>(p.optimizer_update_id(), -1, 1));
        req.set_path(absl::StrCat("/ckpt/ckpt-", req.checkpoint_id()));
        (void)machine_->AckCheckpoint(req, now_);
        break;
      }
      case 5: {
        v1::ReportFailureRequest req;
        req.set_job_id("job-1");
        req.set_worker_id(Worker());
        req.set_message(in_.String(16));
        if (in_.Bool()) {
          // A rank found a checkpoint damaged: mostly the one its generation loads.
          req.set_damaged_checkpoint_id(
              in_.Bool() ? machine_->Snapshot().generation().assignment().checkpoint_id()
                         : in_.Range(-1, 8));
        }
        (void)machine_->ReportFailure(req, now_);
        break;
      }
      case 6:
      case 7: {
        // Mostly short steps; sometimes past a lease, so workers are lost.
        const int64_t ms = in_.Bool() ? in_.Range(0, 30'000) : in_.Range(0, 255);
        now_ += absl::Milliseconds(ms);
        machine_->Tick(now_);
        break;
      }
      default:
        if (in_.Byte() == 1) (void)machine_->Cancel(now_);
        break;
    }
  }

  void Check() {
    std::vector<v1::JournalRecord> records = machine_->TakeRecords();
    const v1::GenerationFormed* rollback = nullptr;
    for (const v1::JournalRecord& r : records) {
      FUZZ_CHECK(!r.has_job_submitted());
      if (r.has_generation_formed() && r.generation_formed().rolled_back()) {
        rollback = &r.generation_formed();
      }
      // Replay would refuse a record the machine could not have emitted; it emits none such.
      const absl::Status follows = replica_->CheckFollows(r);
      FUZZ_CHECK(follows.ok(), follows.ToString() + "\n" + r.DebugString());
      replica_->Apply(r);
    }
    const Ids now = IdsOf(*machine_);
    const std::string where = absl::StrCat("after ", records.size(), " records:\n",
                                           machine_->Job().progress().DebugString());
    FUZZ_CHECK(now.generation >= ids_.generation, where);
    if (rollback == nullptr) {
      FUZZ_CHECK(now.window >= ids_.window, where);
      FUZZ_CHECK(now.update >= ids_.update, where);
      FUZZ_CHECK(now.scheduler >= ids_.scheduler, where);
      FUZZ_CHECK(now.checkpoint >= ids_.checkpoint, where);
      FUZZ_CHECK(now.tokens >= ids_.tokens, where);
    } else {
      // A rollback returns to a durable checkpoint's ids or, when none is durable yet, to the
      // start (checkpoint 0, every id 0, INIT: StepMachineTest's
      // AllLostWithoutDurableCheckpointRestartsFromInit); neither lies ahead.
      const v1::CheckpointRecord& to = rollback->rollback_to();
      const v1::Assignment::StateSource source = rollback->assignment().state_source();
      FUZZ_CHECK(to.durable() ? source == v1::Assignment::CHECKPOINT &&
                                    rollback->assignment().checkpoint_id() == to.checkpoint_id()
                              : source == v1::Assignment::INIT && to.checkpoint_id() == 0 &&
                                    to.optimizer_update_id() == 0 && to.window_id() == 0,
                 rollback->DebugString());
      FUZZ_CHECK(rollback->rollback_to().optimizer_update_id() <= ids_.update, where);
      FUZZ_CHECK(rollback->rollback_to().window_id() <= ids_.window, where);
    }
    FUZZ_CHECK(now.update >= 0 && now.update <= now.window, where);
    FUZZ_CHECK(now.scheduler >= 0 && now.scheduler <= now.window, where);
    FUZZ_CHECK(std::isfinite(machine_->Job().progress().loss_scale()) &&
                   machine_->Job().progress().loss_scale() > 0,
               where);
    FUZZ_CHECK(Comparable(replica_->Snapshot()) == Comparable(machine_->Snapshot()),
               "replaying the journal records gives another machine\n" + where);
    ids_ = now;
  }

  FuzzInput& in_;
  MachineOptions options_;
  absl::Time now_ = absl::FromUnixSeconds(1'700'000'000);
  std::unique_ptr<StepMachine> machine_;
  std::unique_ptr<StepMachine> replica_;
  Ids ids_;
};

}  // namespace
}  // namespace trainstep

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  trainstep::fuzz::FuzzInput in(data, size);
  trainstep::Harness harness(in);
  harness.Run();
  return 0;
}
