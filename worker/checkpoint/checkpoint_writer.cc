#include "worker/checkpoint/checkpoint_writer.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace trainstep {

CheckpointWriter::CheckpointWriter(std::string dir, int keep_last, ckpt::ExtraFiles extra_files,
                                   OnWritten on_written, Env* env)
    : dir_(std::move(dir)), keep_last_(keep_last), on_written_(std::move(on_written)), env_(env) {
  options_.extra_files = std::move(extra_files);
}

CheckpointWriter::~CheckpointWriter() {
  absl::Status s = Flush();
  if (!s.ok()) LogError(absl::StrCat("checkpoint: ", s.message()));
}

absl::Status CheckpointWriter::Submit(const ckpt::CheckpointMeta& meta,
                                      const HostCopy::Tensors& model,
                                      const HostCopy::Tensors& optimizer) {
  if (absl::Status previous = Flush(); !previous.ok()) return previous;
  model_ = HostCopy::Start(model);
  optimizer_ = HostCopy::Start(optimizer);
  thread_ = std::thread([this, meta] {
    absl::StatusOr<std::string> path = ckpt::WriteCheckpoint(
        dir_, meta, model_->Wait(), optimizer_->Wait(), keep_last_, env_, options_);
    if (!path.ok() && on_failed_) {
      on_failed_(meta, path.status());
      return;
    }
    status_ = path.ok() ? on_written_(meta, *path) : path.status();
  });
  return absl::OkStatus();
}

void CheckpointWriter::BeforeParametersChange() {
  if (model_ != nullptr) model_->OrderBeforeChanges();
  if (optimizer_ != nullptr) optimizer_->OrderBeforeChanges();
}

absl::Status CheckpointWriter::Flush() {
  if (thread_.joinable()) thread_.join();
  model_.reset();
  optimizer_.reset();
  return std::exchange(status_, absl::OkStatus());
}

}  // namespace trainstep
