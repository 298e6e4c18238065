// RankScores: which rank is slow. Each decided window, every rank reports where its
// window went (WindowPhases); this keeps, per worker, its compute time per unit (token or
// sample, so a rank with a shorter share is not mistaken for a fast one) averaged over its
// last `window_count` scored windows, and scores it the way NVIDIA's resiliency extension
// scores stragglers:
//   relative   = fastest rank's average ÷ this worker's, among the ranks of the latest window
//                it ranked in (1: as fast as the fastest; 0.33: three times slower),
//   individual = its own best average so far ÷ its current one (< 1: slower than it was; 1
//                until its first `window_count` windows gave a full average).
// With a replacement threshold it also counts, per worker, the scored windows in a row whose
// relative score was below it (windows_below): the step machine drains on that streak.
// Pure and in memory: scores are observations, not decisions, so they are not journaled; a
// restarted coordinator scores afresh within `window_count` windows.
#ifndef TRAINSTEP_COORDINATOR_RANK_SCORES_H_
#define TRAINSTEP_COORDINATOR_RANK_SCORES_H_

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "trainstep/v1/types.pb.h"

namespace trainstep {

class RankScores {
 public:
  // `below`: stragglers.replace_below, whose streaks each score counts (windows_below).
  explicit RankScores(int32_t window_count, std::optional<double> below = std::nullopt);

  // One rank's report of a decided window.
  struct Sample {
    std::string worker_id;
    int64_t units = 0;  // its share's valid units: a rank with none is not scored
    v1::WindowPhases phases;
  };
  // A decided window's reports, by rank. Ranks without phases or units are left out of it.
  void Observe(const std::vector<Sample>& window);
  // The worker's scores, or nullopt before it ranked in a scored window.
  std::optional<v1::RankScore> Find(const std::string& worker_id) const;

 private:
  struct History {
    std::deque<v1::WindowPhases> phases;  // the last window_count scored windows
    std::deque<double> per_unit;          // compute seconds per unit, the same windows
    double per_unit_sum = 0.0;
    double best = 0.0;  // lowest full-window average seen (0 = none yet)
    v1::RankScore score;
    double Average() const { return per_unit_sum / static_cast<double>(per_unit.size()); }
  };
  size_t window_count_;
  std::optional<double> below_;
  absl::flat_hash_map<std::string, History> history_;
};

}  // namespace trainstep

#endif  // TRAINSTEP_COORDINATOR_RANK_SCORES_H_
