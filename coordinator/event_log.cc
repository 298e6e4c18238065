#include "coordinator/event_log.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/log.h"
#include "common/proto_json.h"
#include "core/window_outcome.h"

namespace trainstep {

void EventLog::OnRecord(const v1::JournalRecord& record, const v1::Job& job) {
  switch (record.kind_case()) {
    case v1::JournalRecord::kWindowEnded: {
      const v1::UpdateRecord& r = record.window_ended().decision().record();
      std::string text = absl::StrFormat(
          "%s window %d gen %d: %s update=%d loss=%.5g lr=%.4g scale=%g norm=%.4g->%.4g "
          "tokens=%d",
          job.job_id(), r.window_id(), r.generation(), OutcomeText(r), r.optimizer_update_id(),
          r.loss(), r.learning_rate(), r.loss_scale(), r.grad_norm_pre_clip(),
          r.grad_norm_post_clip(), r.global_valid_tokens());
      absl::StrAppend(&text, " micro_step=", r.micro_step_id());
      if (r.has_update_interval_seconds()) {
        absl::StrAppend(&text, absl::StrFormat(" interval=%.3fs", r.update_interval_seconds()));
      }
      if (r.has_grad_norm_scaled()) {
        absl::StrAppend(&text, absl::StrFormat(" scaled_norm=%.4g", r.grad_norm_scaled()));
      }
      if (r.tail_window()) absl::StrAppend(&text, " tail");
      if (r.has_dropped_tail()) {
        absl::StrAppend(&text, " dropped=", r.dropped_tail().samples(), " (epoch ",
                        r.dropped_tail().epoch(), ", positions ", r.dropped_tail().first_position(),
                        "+)");
      }
      if (r.has_rerun()) {
        // Which rank, or which data: the line a user greps for after a bad window.
        const v1::Rerun& rr = r.rerun();
        absl::StrAppend(&text, " rerun=", rr.cause(), ":", rr.verdict(), " rank=", rr.rank(), " (",
                        rr.worker_id(), ")");
        if (VerdictOf(rr) == v1::RERUN_VERDICT_TRANSIENT) {
          absl::StrAppend(&text, " ranks=", absl::StrJoin(rr.ranks(), ","), ": a fault on ",
                          rr.worker_id(), ", marked suspect; its first run discarded");
        } else if (!rr.sample_ids().empty()) {
          absl::StrAppend(&text, " samples=", absl::StrJoin(rr.sample_ids(), ","));
        }
      }
      std::string json = RecordToJson(r);
      json.insert(1, absl::StrCat("\"event\":\"window_ended\",\"training_job\":",
                                  JsonQuote(job.job_id()), ","));
      LogEvent(text, json);
      break;
    }
    case v1::JournalRecord::kEvalEnded: {
      const v1::EvalEnded& e = record.eval_ended();
      std::string text =
          absl::StrFormat("%s eval update=%d gen %d: eval_loss=%.5g tokens=%d", job.job_id(),
                          e.optimizer_update_id(), e.generation(), e.eval_loss(), e.valid_units());
      v1::EvalEnded fields = e;
      fields.clear_job_id();  // named training_job, as on window lines
      std::string json = RecordToJson(fields);
      json.replace(0, std::string("{\"job_id\":\"\",").size(),
                   absl::StrCat("{\"event\":\"eval_ended\",\"training_job\":",
                                JsonQuote(job.job_id()), ","));
      LogEvent(text, json);
      break;
    }
    case v1::JournalRecord::kJobSubmitted:
      LogInfo(absl::StrCat("job ", job.job_id(), " (", job.name(), ") submitted"));
      break;
    case v1::JournalRecord::kJobEnded:
      LogInfo(absl::StrCat(
          "job ", job.job_id(), " ended: ", v1::JobState_Name(record.job_ended().state()),
          record.job_ended().message().empty() ? "" : ": ", record.job_ended().message()));
      break;
    case v1::JournalRecord::kGenerationFormed: {
      const v1::GenerationFormed& f = record.generation_formed();
      const std::string text = absl::StrCat(
          "job ", job.job_id(), " generation ", f.generation(), " formed: ", f.worker_ids_size(),
          " ranks, state from ", v1::Assignment::StateSource_Name(f.assignment().state_source()),
          f.rolled_back() ? " (rolled back to checkpoint " : "",
          f.rolled_back() ? absl::StrCat(f.rollback_to().checkpoint_id(), ")") : "");
      // The whole record for tools (the chaos judge reads ranks, state source and rollbacks).
      v1::GenerationFormed fields = f;
      fields.clear_job_id();
      std::string json = RecordToJson(fields);
      json.replace(0, std::string("{\"job_id\":\"\",").size(),
                   absl::StrCat("{\"event\":\"generation_formed\",\"training_job\":",
                                JsonQuote(job.job_id()), ","));
      LogEvent(text, json);
      break;
    }
    case v1::JournalRecord::kWorkerLost:
      LogWarning(absl::StrCat("job ", job.job_id(),
                              record.worker_lost().drained() ? " drained worker " : " lost worker ",
                              record.worker_lost().worker_id(), ": ",
                              record.worker_lost().reason()));
      break;
    case v1::JournalRecord::kGenerationEnded:
      LogWarning(absl::StrCat("job ", job.job_id(), " generation ",
                              record.generation_ended().generation(),
                              " ended: ", record.generation_ended().reason(),
                              record.generation_ended().worker_id().empty() ? "" : " (",
                              record.generation_ended().worker_id(),
                              record.generation_ended().worker_id().empty() ? "" : ")"));
      break;
    case v1::JournalRecord::kCheckpointDurable:
      LogInfo(absl::StrCat("job ", job.job_id(), " checkpoint ",
                           record.checkpoint_durable().checkpoint_id(), " durable at ",
                           record.checkpoint_durable().path()));
      break;
    default:
      break;
  }
}

}  // namespace trainstep
