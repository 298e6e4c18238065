// Rank 0's checkpoints, written without holding up training: Submit() starts a host copy of
// the model and optimizer (host_copy.h: off the device on a side stream) and returns; a
// background thread waits for the copy, writes ckpt-<id> (checkpoint_dir.h: temp dir, fsync,
// rename) and then runs `on_written` (the AckCheckpoint RPC: durable only from then on).
// One checkpoint is in flight at a time; a failed write is returned by the next Submit or
// Flush, or, with an OnFailed, given to it (and training goes on). Submit,
// BeforeParametersChange and Flush are called from one thread.
#ifndef TRAINSTEP_WORKER_CHECKPOINT_CHECKPOINT_WRITER_H_
#define TRAINSTEP_WORKER_CHECKPOINT_CHECKPOINT_WRITER_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "worker/checkpoint/checkpoint_dir.h"
#include "worker/train/host_copy.h"

namespace trainstep {

class CheckpointWriter {
 public:
  using OnWritten =
      std::function<absl::Status(const ckpt::CheckpointMeta& meta, const std::string& path)>;
  // A write that failed (the disk full or failing): nothing of it is visible, the previous
  // checkpoint stays. Called on the writing thread; Flush returns after it.
  using OnFailed = std::function<void(const ckpt::CheckpointMeta& meta, const absl::Status& why)>;
  // Before the first Submit: failed writes go to `on_failed` instead of failing what follows.
  void set_on_failed(OnFailed on_failed) { on_failed_ = std::move(on_failed); }

  // `extra_files` go into every checkpoint beside the tensors (Model::CheckpointFiles).
  CheckpointWriter(std::string dir, int keep_last, ckpt::ExtraFiles extra_files,
                   OnWritten on_written, Env* env = Env::Default());
  ~CheckpointWriter();  // waits for the write in flight (its error is logged)

  // Waits for the previous checkpoint (returning its error, and then writing nothing), then
  // starts this one. `model` and `optimizer` may live on the device; they are read as of now.
  absl::Status Submit(const ckpt::CheckpointMeta& meta, const HostCopy::Tensors& model,
                      const HostCopy::Tensors& optimizer);
  // Call before the parameters or optimizer state change in place (optimizer step, restore):
  // the device then waits for the copy to have read them. Never blocks the host.
  void BeforeParametersChange();
  // Waits for the checkpoint in flight; its status (OK when there is none).
  absl::Status Flush();

 private:
  const std::string dir_;
  const int keep_last_;
  ckpt::WriteOptions options_;
  const OnWritten on_written_;
  OnFailed on_failed_;
  Env* const env_;
  // In flight: the copies and the thread writing them; status_ is written by that thread
  // before it ends and read only after joining it.
  std::unique_ptr<HostCopy> model_;
  std::unique_ptr<HostCopy> optimizer_;
  std::thread thread_;
  absl::Status status_;
};

}  // namespace trainstep

#endif  // TRAINSTEP_WORKER_CHECKPOINT_CHECKPOINT_WRITER_H_
