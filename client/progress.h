// ProgressTracker: turns the events of a WatchJob stream into what the live progress line
// shows. The rates and the ETA are the coordinator's (Job.throughput: the last minute of the
// log, coordinator/throughput.h) when its job events carry them; otherwise they count only what
// happened while watching: the stream first replays the job's history, which must not read as
// a burst of throughput. Time is passed in, so the rates and the ETA are tested without
// sleeping. Not thread-safe (one stream, one reader).
#ifndef TRAINSTEP_CLIENT_PROGRESS_H_
#define TRAINSTEP_CLIENT_PROGRESS_H_

#include <cstdint>
#include <optional>

#include "absl/time/time.h"
#include "client/format.h"
#include "trainstep/v1/types.pb.h"

namespace trainstep::client {

class ProgressTracker {
 public:
  void OnJob(const v1::Job& job, absl::Time now);
  void OnUpdate(const v1::UpdateRecord& record, absl::Time now);

  // False until the first Job event.
  bool has_job() const { return has_job_; }
  // The latest Job event.
  const v1::Job& job() const { return job_; }
  ProgressView View(absl::Time now) const;

 private:
  bool has_job_ = false;
  v1::Job job_;
  // Baselines, taken at the first Job event: the state of the job when watching began.
  absl::Time start_;
  int64_t base_tokens_ = 0;
  int64_t base_updates_ = 0;
  int64_t base_windows_ = 0;
  // The furthest the job is known to have got, from Job events and records alike.
  int64_t tokens_ = 0;
  int64_t updates_ = 0;
  int64_t windows_ = 0;
  // Values of the newest window seen (a record may be newer than the last Job event).
  int64_t latest_window_ = -1;
  bool has_loss_ = false;
  double loss_ = 0;
  std::optional<double> eval_loss_;
  double loss_scale_ = 0;
  double learning_rate_ = 0;
};

}  // namespace trainstep::client

#endif  // TRAINSTEP_CLIENT_PROGRESS_H_
