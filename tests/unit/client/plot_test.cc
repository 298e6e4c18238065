// `job plot`'s held-out loss: a series of the loss panel, drawn from the records that carry an
// eval_loss and only from them. (The rest of the picture: tests/observability/job_plot_test.cc.)
#include "client/plot.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/match.h"

namespace trainstep::client {
namespace {

constexpr char kLossColor[] = "#1f77b4";
constexpr char kEvalColor[] = "#e377c2";

v1::UpdateRecord Commit(int64_t update) {
  v1::UpdateRecord r;
  r.set_generation(1);
  r.set_window_id(update);
  r.set_outcome("commit");
  r.set_optimizer_update_id(update);
  r.set_loss(2.0 - 0.1 * static_cast<double>(update));
  r.set_learning_rate(1e-3);
  r.set_loss_scale(1);
  return r;
}

struct Dot {
  double x, y;
};

// The data points drawn in `color`, left to right, with the offset of the first one.
std::vector<Dot> Dots(const std::string& svg, const std::string& color, size_t* first = nullptr) {
  const std::regex circle("<circle cx=\"([-0-9.]+)\" cy=\"([-0-9.]+)\" r=\"[0-9.]+\" fill=\"" +
                          color + "\"/>");
  std::vector<Dot> dots;
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), circle); it != std::sregex_iterator();
       ++it) {
    if (first != nullptr && dots.empty()) *first = static_cast<size_t>(it->position());
    dots.push_back({std::stod((*it)[1].str()), std::stod((*it)[2].str())});
  }
  std::sort(dots.begin(), dots.end(), [](const Dot& a, const Dot& b) { return a.x < b.x; });
  return dots;
}

// Catches: the eval series missing from the loss panel, drawn at the wrong updates or values,
// taken from records without an evaluation, or a 0.0 result dropped as if it were unset.
TEST(PlotEvalTest, EvalSeriesComesFromTheEvaluatedRecordsInTheLossPanel) {
  PlotInput in;
  in.job_id = "job-3";
  for (int64_t u = 1; u <= 6; ++u) in.records.push_back(Commit(u));
  in.records[1].set_eval_loss(3.5);  // updates 2, 4 and 6 were evaluated
  in.records[3].set_eval_loss(3.0);
  in.records[5].set_eval_loss(0.0);
  const std::string svg = RenderPlotSvg(in);

  EXPECT_TRUE(absl::StrContains(svg, ">eval (held-out)</text>")) << svg;  // its legend
  size_t first_eval = 0;
  const std::vector<Dot> eval = Dots(svg, kEvalColor, &first_eval);
  const std::vector<Dot> loss = Dots(svg, kLossColor);
  ASSERT_EQ(loss.size(), 6u);
  ASSERT_EQ(eval.size(), 3u) << svg;
  for (size_t i = 0; i < eval.size(); ++i) EXPECT_EQ(eval[i].x, loss[2 * i + 1].x) << i;
  // A higher loss is drawn higher up (a smaller y).
  EXPECT_LT(eval[0].y, eval[1].y);
  EXPECT_LT(eval[1].y, eval[2].y);
  // In the first panel (the loss's), joined by one line.
  const size_t loss_panel = svg.find("id=\"panel-0\"");
  const size_t next_panel = svg.find("id=\"panel-1\"");
  ASSERT_NE(loss_panel, std::string::npos);
  EXPECT_GT(first_eval, loss_panel);
  EXPECT_LT(first_eval, next_panel);
  EXPECT_TRUE(absl::StrContains(svg, std::string("stroke=\"") + kEvalColor)) << svg;
}

// Catches: an eval series (or its legend) drawn for a job whose records carry no evaluation.
TEST(PlotEvalTest, NoEvalSeriesWithoutEvaluatedRecords) {
  PlotInput in;
  in.job_id = "job-3";
  for (int64_t u = 1; u <= 6; ++u) in.records.push_back(Commit(u));
  const std::string svg = RenderPlotSvg(in);
  EXPECT_EQ(Dots(svg, kLossColor).size(), 6u);
  EXPECT_FALSE(absl::StrContains(svg, "eval (held-out)")) << svg;
  EXPECT_FALSE(absl::StrContains(svg, kEvalColor)) << svg;
}

}  // namespace
}  // namespace trainstep::client
