#include "client/format.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/spec.h"
#include "core/window_outcome.h"

namespace trainstep::client {
namespace {

// Display width: UTF-8 continuation bytes take no column.
size_t Width(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

const char* AnsiCode(Color color) {
  switch (color) {
    case Color::kRed:
      return "\033[31m";
    case Color::kGreen:
      return "\033[32m";
    case Color::kYellow:
      return "\033[33m";
    case Color::kCyan:
      return "\033[36m";
    case Color::kBold:
      return "\033[1m";
    case Color::kNone:
      break;
  }
  return "";
}

}  // namespace

std::string ShortDuration(absl::Duration d) {
  if (d <= absl::ZeroDuration()) return "0s";
  if (d < absl::Seconds(1)) return absl::StrCat(absl::ToInt64Milliseconds(d), "ms");
  const int64_t total = absl::ToInt64Seconds(d);
  const int64_t days = total / 86400, hours = total / 3600 % 24, minutes = total / 60 % 60,
                seconds = total % 60;
  auto two = [](int64_t a, const char* ua, int64_t b, const char* ub) {
    return b == 0 ? absl::StrCat(a, ua) : absl::StrCat(a, ua, b, ub);
  };
  if (days > 0) return two(days, "d", hours, "h");
  if (hours > 0) return two(hours, "h", minutes, "m");
  if (minutes > 0) return two(minutes, "m", seconds, "s");
  return absl::StrCat(seconds, "s");
}

std::string FormatSi(double value) {
  if (!std::isfinite(value)) return "-";
  if (value < 0) return absl::StrCat("-", FormatSi(-value));
  if (value < 1000 && value == std::floor(value)) return absl::StrFormat("%.0f", value);  // a count
  static const char* const kSuffix[] = {"", "k", "M", "G", "T", "P"};
  constexpr int kLast = 5;
  int unit = 0;
  while (value >= 1000 && unit < kLast) {
    value /= 1000;
    ++unit;
  }
  // Decide the precision on the rounded value, so 99.96 prints "100", and 999.6 moves up
  // to "1.0k" instead of printing "1000".
  bool one_decimal =
      unit == 0 ? std::round(value * 10) / 10 < 10 : std::round(value * 10) / 10 < 100;
  if (!one_decimal && std::round(value) >= 1000 && unit < kLast) {
    value /= 1000;
    ++unit;
    one_decimal = true;
  }
  return absl::StrCat(one_decimal ? absl::StrFormat("%.1f", value) : absl::StrFormat("%.0f", value),
                      kSuffix[unit]);
}

std::string FormatLoss(double loss) { return absl::StrFormat("%.4g", loss); }

std::string FormatLossScale(double scale) {
  if (std::isfinite(scale) && scale == std::floor(scale) && std::fabs(scale) < 1e15) {
    return absl::StrFormat("%.0f", scale);
  }
  return absl::StrFormat("%g", scale);
}

std::string FormatLearningRate(double lr) { return absl::StrFormat("%.1e", lr); }

std::string JobStateName(v1::JobState state) {
  if (state == v1::JOB_STATE_UNSPECIFIED || !v1::JobState_IsValid(state)) return "UNKNOWN";
  return v1::JobState_Name(state);
}

std::string WorkerStateText(const v1::WorkerInfo& worker) {
  const std::string state =
      v1::WorkerState_IsValid(worker.state()) ? v1::WorkerState_Name(worker.state()) : "UNKNOWN";
  // The drain's reason starts with what it was ("straggler: …", "faulty: …"); the whole of it
  // belongs to `job events`, the table says only which.
  if (!worker.drained().empty()) {
    const absl::string_view why = worker.drained();
    return absl::StrCat(state, " (drained: ", why.substr(0, why.find(':')), ")");
  }
  if (worker.replaced_by().empty()) return state;
  return absl::StrCat(state, " (replaced by ", worker.replaced_by(), ")");
}

std::string ScoreCell(const v1::WorkerInfo& worker) {
  if (!worker.has_score()) return "-";
  return absl::StrFormat("%.2f/%.2f", worker.score().relative(), worker.score().individual());
}

std::string RankScoreText(const v1::RankScore& score) {
  const v1::WindowPhases& p = score.phases();
  const auto seconds = [](double s) { return absl::FormatDuration(absl::Seconds(s)); };
  // The replacement streak only when there is one (stragglers.replace_below).
  const std::string below =
      score.windows_below() > 0
          ? absl::StrFormat(", %d in a row below stragglers.replace_below", score.windows_below())
          : "";
  return absl::StrFormat(
      "%s: relative %.2f, individual %.2f (%d windows%s); per window compute %s, data %s, "
      "all-reduce %s, waiting on the coordinator %s",
      score.worker_id(), score.relative(), score.individual(), score.windows(), below,
      seconds(p.compute_seconds()), seconds(p.data_seconds()), seconds(p.allreduce_seconds()),
      seconds(p.coordinator_seconds()));
}

std::string Colorize(const std::string& text, Color color, bool enabled) {
  if (!enabled || color == Color::kNone) return text;
  return absl::StrCat(AnsiCode(color), text, "\033[0m");
}

Color StateColor(v1::JobState state) {
  switch (state) {
    case v1::RUNNING:
      return Color::kCyan;
    case v1::SUCCEEDED:
      return Color::kGreen;
    case v1::FAILED:
      return Color::kRed;
    case v1::CANCELLED:
      return Color::kYellow;
    default:
      return Color::kNone;
  }
}

std::string RenderTable(const std::vector<std::string>& header,
                        const std::vector<std::vector<Cell>>& rows, bool color) {
  std::vector<size_t> widths(header.size(), 0);
  for (size_t c = 0; c < header.size(); ++c) widths[c] = Width(header[c]);
  for (const auto& row : rows) {
    for (size_t c = 0; c < row.size() && c < widths.size(); ++c) {
      widths[c] = std::max(widths[c], Width(row[c].text));
    }
  }
  std::string out;
  auto line = [&](const std::vector<Cell>& cells) {
    std::string l;
    for (size_t c = 0; c < cells.size() && c < widths.size(); ++c) {
      std::string text = cells[c].text;
      if (c + 1 < cells.size()) text.append(widths[c] - Width(text) + 3, ' ');
      absl::StrAppend(&l, Colorize(text, cells[c].color, color));
    }
    // A trailing empty cell would leave the padding of the cell before it.
    while (!l.empty() && l.back() == ' ') l.pop_back();
    absl::StrAppend(&out, l, "\n");
  };
  std::vector<Cell> head(header.begin(), header.end());
  line(head);
  for (const auto& row : rows) line(row);
  return out;
}

std::string RenderKeyValues(const std::vector<std::pair<std::string, std::string>>& lines) {
  size_t width = 0;
  for (const auto& [k, v] : lines) width = std::max(width, Width(k) + 1);
  std::string out;
  for (const auto& [k, v] : lines) {
    std::string key = absl::StrCat(k, ":");
    key.append(width - Width(key) + 1, ' ');
    std::string l = absl::StrCat(key, v);
    while (!l.empty() && l.back() == ' ') l.pop_back();
    absl::StrAppend(&out, l, "\n");
  }
  return out;
}

std::string ProgressBar(int64_t done, int64_t total, int width) {
  double fraction = total > 0 ? static_cast<double>(done) / static_cast<double>(total) : 0;
  fraction = std::clamp(fraction, 0.0, 1.0);
  const int filled = static_cast<int>(fraction * width);
  return absl::StrCat("[", std::string(filled, '#'), std::string(width - filled, '.'), "]");
}

std::string ProgressLine(const ProgressView& v) {
  std::string s = absl::StrCat(v.label, " ", v.done);
  if (v.total > 0) {
    absl::StrAppend(&s, "/", v.total, " ", ProgressBar(v.done, v.total), " ");
  } else {
    absl::StrAppend(&s, "  ");
  }
  if (v.units_per_second.has_value()) {
    absl::StrAppend(&s, FormatSi(*v.units_per_second), " ", v.unit, "/s  ");
  }
  if (v.updates_per_second.has_value()) {
    absl::StrAppend(&s, FormatSi(*v.updates_per_second), " upd/s  ");
  }
  absl::StrAppend(&s, "loss ", v.loss.has_value() ? FormatLoss(*v.loss) : "-");
  if (v.eval_loss.has_value()) absl::StrAppend(&s, "  eval ", FormatLoss(*v.eval_loss));
  absl::StrAppend(&s, "  scale ", FormatLossScale(v.loss_scale), "  lr ",
                  FormatLearningRate(v.learning_rate), "  skipped ", v.skipped);
  if (v.total > 0 && v.eta.has_value()) absl::StrAppend(&s, "  ETA ", ShortDuration(*v.eta));
  if (!v.waiting.empty()) absl::StrAppend(&s, "  (", v.waiting, ")");
  return s;
}

std::string UpdateLine(const v1::UpdateRecord& r) {
  std::string s = absl::StrCat("window ", r.window_id(), " ", OutcomeText(r));
  absl::StrAppend(
      &s, " update=", r.optimizer_update_id(), " loss=", absl::StrFormat("%.5g", r.loss()),
      " lr=", absl::StrFormat("%g", r.learning_rate()), " scale=", FormatLossScale(r.loss_scale()),
      " norm=", absl::StrFormat("%.2f->%.2f", r.grad_norm_pre_clip(), r.grad_norm_post_clip()),
      " tokens=", r.global_valid_tokens(), " micro_step=", r.micro_step_id());
  if (r.has_update_interval_seconds()) {
    absl::StrAppend(&s, absl::StrFormat(" interval=%.3fs", r.update_interval_seconds()));
  }
  if (r.tail_window()) absl::StrAppend(&s, " tail");
  if (r.has_dropped_tail()) absl::StrAppend(&s, " dropped=", r.dropped_tail().samples());
  if (r.has_eval_loss()) absl::StrAppend(&s, " eval_loss=", absl::StrFormat("%.5g", r.eval_loss()));
  return s;
}

std::string DroppedTailText(const v1::DroppedTail& d) {
  constexpr int kShown = 8;
  std::string s = absl::StrCat("epoch ", d.epoch(), ": ", d.samples(), " samples, positions ",
                               d.first_position(), "-", d.first_position() + d.samples() - 1);
  if (d.sample_ids().empty()) return s;
  absl::StrAppend(&s, ", ids");
  for (int i = 0; i < d.sample_ids_size() && i < kShown; ++i) {
    absl::StrAppend(&s, " ", d.sample_ids(i));
  }
  if (d.sample_ids_size() > kShown)
    absl::StrAppend(&s, " … (", d.sample_ids_size() - kShown, " more)");
  return s;
}

std::string ThroughputText(const v1::Job& job) {
  const v1::Throughput& t = job.throughput();
  if (t.span_seconds() <= 0) return "-";
  std::string s = absl::StrCat(FormatSi(t.tokens_per_second()), " ",
                               IsTokenLevel(job.spec()) ? "tok" : "samples", "/s, ",
                               FormatSi(t.updates_per_second()), " updates/s (last ",
                               ShortDuration(absl::Seconds(t.span_seconds())), ")");
  if (t.has_eta_seconds())
    absl::StrAppend(&s, ", ETA ", ShortDuration(absl::Seconds(t.eta_seconds())));
  return s;
}

int64_t MaxUpdates(const v1::Job& job) {
  const v1::JobProgress& p = job.progress();
  if (p.max_updates() > 0) return p.max_updates();
  if (p.windows_per_epoch() > 0 && job.spec().stop().epochs() > 0) {
    return JobTotalWindows(job.spec(), p.windows_per_epoch());
  }
  return 0;
}

}  // namespace trainstep::client
