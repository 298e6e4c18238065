#include "worker/data/collate.h"

#include <algorithm>

namespace trainstep::data {

MicroBatch Collate(const Dataset& data, const std::vector<int64_t>& indices) {
  MicroBatch mb;
  mb.rows = static_cast<int64_t>(indices.size());
  mb.samples = mb.rows;
  if (indices.empty()) return mb;

  if (data.token_level()) {
    // Read once: a token file's samples are cut from the file on every at().
    std::vector<Sample> samples;
    samples.reserve(indices.size());
    for (int64_t i : indices) {
      samples.push_back(data.at(i));
      mb.length =
          std::max<int64_t>(mb.length, static_cast<int64_t>(samples.back().input_ids.size()));
    }
    const size_t cells = static_cast<size_t>(mb.rows * mb.length);
    mb.input_ids.assign(cells, 0);
    mb.labels.assign(cells, kIgnoreLabel);
    for (size_t r = 0; r < samples.size(); ++r) {
      const Sample& s = samples[r];
      const size_t row = r * static_cast<size_t>(mb.length);
      std::copy(s.input_ids.begin(), s.input_ids.end(), mb.input_ids.begin() + row);
      std::copy(s.labels.begin(), s.labels.end(), mb.labels.begin() + row);
      mb.valid_tokens += ValidTokens(s);
    }
    return mb;
  }

  const Sample first = data.at(indices.front());
  mb.feature_dim = static_cast<int64_t>(first.features.size());
  mb.target_dim = static_cast<int64_t>(first.targets.size());
  mb.features.reserve(static_cast<size_t>(mb.rows * mb.feature_dim));
  mb.targets.reserve(static_cast<size_t>(mb.rows * mb.target_dim));
  for (int64_t i : indices) {
    const Sample s = data.at(i);
    mb.features.insert(mb.features.end(), s.features.begin(), s.features.end());
    mb.targets.insert(mb.targets.end(), s.targets.begin(), s.targets.end());
  }
  return mb;
}

}  // namespace trainstep::data
