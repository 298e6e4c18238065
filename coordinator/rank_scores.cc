#include "coordinator/rank_scores.h"

#include <algorithm>
#include <cmath>

namespace trainstep {

RankScores::RankScores(int32_t window_count, std::optional<double> below)
    : window_count_(static_cast<size_t>(std::max(window_count, 1))), below_(below) {}

void RankScores::Observe(const std::vector<Sample>& window) {
  std::vector<size_t> ranked;  // ranks scored in this window
  double fastest = 0.0;
  for (size_t rank = 0; rank < window.size(); ++rank) {
    const Sample& s = window[rank];
    const double compute = s.phases.compute_seconds();
    // Validation keeps reports finite; a rank that computed nothing says nothing of its speed.
    if (s.units <= 0 || !(compute > 0.0) || !std::isfinite(compute)) continue;
    History& h = history_[s.worker_id];
    const double per_unit = compute / static_cast<double>(s.units);
    h.per_unit.push_back(per_unit);
    h.per_unit_sum += per_unit;
    h.phases.push_back(s.phases);
    if (h.per_unit.size() > window_count_) {
      h.per_unit_sum -= h.per_unit.front();
      h.per_unit.pop_front();
      h.phases.pop_front();
    }
    const double average = h.Average();
    // Its best counts full windows only: a partial one (JIT, cold caches) is no baseline.
    if (h.per_unit.size() == window_count_) {
      h.best = h.best == 0.0 ? average : std::min(h.best, average);
    }
    fastest = fastest == 0.0 ? average : std::min(fastest, average);
    ranked.push_back(rank);
  }
  // A second pass, by key: inserting a worker may move the others' histories.
  for (const size_t rank : ranked) {
    History* h = &history_.find(window[rank].worker_id)->second;
    const double average = h->Average();
    v1::RankScore& score = h->score;
    score.set_relative(std::min(1.0, fastest / average));
    score.set_individual(h->best > 0.0 ? std::min(1.0, h->best / average) : 1.0);
    score.set_windows(score.windows() + 1);
    if (below_.has_value()) {
      score.set_windows_below(score.relative() < *below_ ? score.windows_below() + 1 : 0);
    }
    score.set_rank(static_cast<int32_t>(rank));
    score.set_worker_id(window[rank].worker_id);
    v1::WindowPhases mean;
    for (const v1::WindowPhases& p : h->phases) {
      mean.set_data_seconds(mean.data_seconds() + p.data_seconds());
      mean.set_compute_seconds(mean.compute_seconds() + p.compute_seconds());
      mean.set_allreduce_seconds(mean.allreduce_seconds() + p.allreduce_seconds());
      mean.set_coordinator_seconds(mean.coordinator_seconds() + p.coordinator_seconds());
    }
    const double n = static_cast<double>(h->phases.size());
    mean.set_data_seconds(mean.data_seconds() / n);
    mean.set_compute_seconds(mean.compute_seconds() / n);
    mean.set_allreduce_seconds(mean.allreduce_seconds() / n);
    mean.set_coordinator_seconds(mean.coordinator_seconds() / n);
    *score.mutable_phases() = std::move(mean);
  }
}

std::optional<v1::RankScore> RankScores::Find(const std::string& worker_id) const {
  auto it = history_.find(worker_id);
  if (it == history_.end()) return std::nullopt;
  return it->second.score;
}

}  // namespace trainstep
