// How the CLI prints things: durations, SI-suffixed rates, aligned tables, the live progress
// line and the plain per-update line of `job watch`. Pure functions of their arguments.
#ifndef TRAINSTEP_CLIENT_FORMAT_H_
#define TRAINSTEP_CLIENT_FORMAT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "trainstep/v1/types.pb.h"

namespace trainstep::client {

// "500ms", "42s", "1m20s", "2m", "3h5m", "2d4h"; negative durations print as "0s". Whole
// units below the largest two are dropped (an age or an ETA needs no more).
std::string ShortDuration(absl::Duration d);

// Rates and counts with k / M / G / T and three significant digits at most: 0 → "0",
// 3.14 → "3.1", 950 → "950", 3140 → "3.1k", 12500 → "12.5k", 1.26e6 → "1.3M"; "-" for a
// non-finite value.
std::string FormatSi(double value);

std::string FormatLoss(double loss);        // "2.314"
std::string FormatLossScale(double scale);  // "65536"; "%g" beyond integers
std::string FormatLearningRate(double lr);  // "8.0e-04"

// "PENDING", "RUNNING", ...
std::string JobStateName(v1::JobState state);

// The STATE cell of `worker list`: "ACTIVE", "LOST", "LOST (replaced by w-7)" once the
// same worker registered again under a new id.
std::string WorkerStateText(const v1::WorkerInfo& worker);

// The SCORE cell of `worker list`: "relative/individual", "0.33/0.98"; "-" before it ranked
// in a scored window.
std::string ScoreCell(const v1::WorkerInfo& worker);
// A rank's line in `job get`: its worker, both scores and the mean phase times per window,
// "w-2: relative 0.33, individual 0.98 (20 windows); per window compute 1.234s, data 2ms,
// all-reduce 10ms, waiting on the coordinator 1ms".
std::string RankScoreText(const v1::RankScore& score);

enum class Color { kNone, kRed, kGreen, kYellow, kCyan, kBold };
// Wraps `text` in the ANSI codes of `color` when `enabled`.
std::string Colorize(const std::string& text, Color color, bool enabled);
Color StateColor(v1::JobState state);

// One table cell; the colour is applied after padding so that columns stay aligned.
struct Cell {
  Cell(std::string t) : text(std::move(t)) {}  // NOLINT: strings are cells
  Cell(const char* t) : text(t) {}             // NOLINT
  Cell(std::string t, Color c) : text(std::move(t)), color(c) {}
  std::string text;
  Color color = Color::kNone;
};

// Left-aligned columns separated by three spaces, header first; no trailing spaces.
// Widths count UTF-8 code points, so "≥" or "—" do not shift a column.
std::string RenderTable(const std::vector<std::string>& header,
                        const std::vector<std::vector<Cell>>& rows, bool color);

// "key: value" lines with the values aligned.
std::string RenderKeyValues(const std::vector<std::pair<std::string, std::string>>& lines);

// "[#######.....]": `width` cells, filled in proportion to done / total (clamped to 0..1).
std::string ProgressBar(int64_t done, int64_t total, int width = 12);

// What the live line of `job watch` shows.
struct ProgressView {
  std::string label = "update";  // "update", or "window" for a job bounded by epochs
  int64_t done = 0;
  int64_t total = 0;  // 0 = unknown: no "/total", no bar, no ETA
  std::optional<double> units_per_second;
  std::optional<double> updates_per_second;  // shown when set (the coordinator's rate)
  std::string unit = "tok";                  // "tok" for token-level data, else "samples"
  std::optional<double> loss;                // none before the first committed update
  std::optional<double> eval_loss;  // the latest held-out loss (spec.eval), when there is one
  double loss_scale = 0;
  double learning_rate = 0;
  int64_t skipped = 0;
  std::optional<absl::Duration> eta;  // shown only with a total
  std::string waiting;                // what a job short of workers waits for ("" = training)
};

// "update 120/200 [#######.....] 3.1k tok/s  2.1 upd/s  loss 2.314  eval 2.402  scale 65536
// lr 8.0e-04  skipped 2  ETA 1m20s" (upd/s and eval only when known)
std::string ProgressLine(const ProgressView& view);

// One line per record when the progress line is not redrawn in place:
// "window 12 commit update=12 loss=2.3141 lr=0.0008 scale=65536 norm=1.23->1.00 tokens=4096
// micro_step=96 interval=1.250s"; a skip or abort carries its reason after the outcome
// ("window 13 skip OVERFLOW ..."); "tail" marks a short tail window, "dropped=4" an epoch
// whose tail was dropped; " eval_loss=2.402" when the update was evaluated.
std::string UpdateLine(const v1::UpdateRecord& record);

// "epoch 1: 4 samples, positions 40-43, ids 40 41 42 43": the first 8 ids, then how many more
// (`job logs` lists them all); no ids when the record lists none.
std::string DroppedTailText(const v1::DroppedTail& dropped);
// `job get`'s throughput line from Job.throughput: "3.1k tok/s, 2.1 updates/s (last 1m), ETA
// 1m20s"; "samples/s" for sample-level data; "-" before the job ran.
std::string ThroughputText(const v1::Job& job);

// The largest number of optimizer updates the job can reach: stop.max_updates, else
// windows_per_epoch × epochs once the dataset is known; 0 = not known.
int64_t MaxUpdates(const v1::Job& job);

}  // namespace trainstep::client

#endif  // TRAINSTEP_CLIENT_FORMAT_H_
