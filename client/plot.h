// `trainstep job plot`: a job's per-update log drawn as one SVG document, written here by
// hand (no plotting dependency). Stacked panels share the x axis (optimizer_update_id):
// loss, learning rate, loss scale (log₂ axis), gradient norm before and after clipping, the
// norm before unscaling (log₂ axis; only with a loss scaler) and the seconds between commits.
// Skipped and aborted windows are marked in every panel. A pure function of its input.
#ifndef TRAINSTEP_CLIENT_PLOT_H_
#define TRAINSTEP_CLIENT_PLOT_H_

#include <string>
#include <vector>

#include "trainstep/v1/types.pb.h"

namespace trainstep::client {

struct PlotInput {
  std::string job_id;
  std::string job_name;
  std::vector<v1::UpdateRecord> records;  // in log order
};

// Always a complete document: no records, one record, constant series and non-finite
// values (not plotted, counted in the panel title) give a valid picture with finite
// coordinates. Commits are drawn at x = optimizer_update_id; a skipped or aborted window,
// which changes no parameter, at x = its optimizer_update_id + 0.5 (between the update
// before it and the next one).
std::string RenderPlotSvg(const PlotInput& input);

}  // namespace trainstep::client

#endif  // TRAINSTEP_CLIENT_PLOT_H_
