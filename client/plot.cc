#include "client/plot.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/window_outcome.h"

namespace trainstep::client {
namespace {

constexpr double kWidth = 960;
constexpr double kLeft = 86;  // room for the y tick labels
constexpr double kRight = 24;
constexpr double kHeader = 84;  // title, subtitle, legend of the marks
constexpr double kPanelHeight = 170;
constexpr double kPanelGap = 56;  // x tick labels below a panel, the next one's title
constexpr double kFooter = 24;
// Values beyond this are drawn at it: keeps spans and coordinates finite.
constexpr double kClamp = 1e300;

constexpr char kLossColor[] = "#1f77b4";
constexpr char kLrColor[] = "#2ca02c";
constexpr char kScaleColor[] = "#9467bd";
constexpr char kPreClipColor[] = "#8c564b";
constexpr char kPostClipColor[] = "#17becf";
constexpr char kScaledColor[] = "#7f7f7f";
constexpr char kIntervalColor[] = "#bcbd22";
constexpr char kEvalColor[] = "#e377c2";
constexpr char kSkipColor[] = "#ff7f0e";
constexpr char kAbortColor[] = "#d62728";
constexpr char kGridColor[] = "#e9ecef";
constexpr char kAxisColor[] = "#868e96";

std::string Escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        // Control characters are not allowed in XML 1.0 text.
        if (static_cast<unsigned char>(c) >= 0x20 || c == '\t' || c == '\n') out += c;
    }
  }
  return out;
}

// A coordinate: two decimals, and never "nan" or "inf" in the document.
std::string Num(double v) { return absl::StrFormat("%.2f", std::isfinite(v) ? v : 0.0); }

std::string TickLabel(double v) { return absl::StrFormat("%.4g", v); }

// Powers of two: whole ones in full ("65536", not "6.554e+04").
std::string Pow2Label(double exponent) {
  const double v = std::exp2(exponent);
  if (exponent >= 0 && exponent <= 50 && v == std::floor(v)) return absl::StrFormat("%.0f", v);
  return TickLabel(v);
}

struct Point {
  double x = 0;
  double y = 0;  // non-finite: left out of the picture, breaks the line
};

struct Series {
  std::string label;
  const char* color;
  std::vector<Point> points;
  bool steps = false;  // the value holds until the next point (the loss scale)
};

struct Panel {
  std::string title;
  bool log2 = false;  // y axis in powers of two; values ≤ 0 are not drawable
  std::vector<Series> series;
};

struct Mark {
  double x = 0;
  bool abort = false;
  std::string tooltip;
};

struct Range {
  double lo = 0;
  double hi = 1;
};

double Clamp(double v) { return std::max(-kClamp, std::min(kClamp, v)); }

// The drawable y of a value on this panel's axis, if any.
bool Drawable(const Panel& p, double y, double* out) {
  if (!std::isfinite(y)) return false;
  if (p.log2) {
    if (y <= 0) return false;
    *out = std::log2(y);
    return true;
  }
  *out = Clamp(y);
  return true;
}

// 1, 2, 2.5 or 5 times a power of ten, so that about `count` steps span `span`.
double NiceStep(double span, int count) {
  const double raw = span / count;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double norm = raw / mag;
  const double nice = norm <= 1 ? 1 : norm <= 2 ? 2 : norm <= 2.5 ? 2.5 : norm <= 5 ? 5 : 10;
  return nice * mag;
}

std::vector<double> LinearTicks(Range r, int count, bool integers) {
  std::vector<double> ticks;
  double step = NiceStep(r.hi - r.lo, count);
  if (!std::isfinite(step) || step <= 0) return ticks;
  if (integers) step = std::max(1.0, std::ceil(step));
  const double first = std::ceil(r.lo / step) * step;
  for (int i = 0; i < 50; ++i) {
    double v = first + i * step;
    if (v > r.hi + step * 1e-9) break;
    if (std::abs(v) < step * 1e-9) v = 0;  // no "-0"
    ticks.push_back(v);
  }
  return ticks;
}

// The y range of a panel (in axis units: log₂ of the value on a log panel).
Range YRange(const Panel& p) {
  double lo = HUGE_VAL, hi = -HUGE_VAL;
  for (const Series& s : p.series) {
    for (const Point& pt : s.points) {
      double y;
      if (!Drawable(p, pt.y, &y)) continue;
      lo = std::min(lo, y);
      hi = std::max(hi, y);
    }
  }
  if (lo > hi) return Range{0, 1};
  if (p.log2) {
    // Whole powers of two at both ends, then a margin so that no point sits on the frame.
    Range r{std::floor(lo), std::ceil(hi)};
    if (r.hi - r.lo < 1) {
      r.lo -= 1;
      r.hi += 1;
    }
    const double margin = (r.hi - r.lo) * 0.06;
    return {r.lo - margin, r.hi + margin};
  }
  const double span = hi - lo;
  if (!(span > 0) || !std::isfinite(span)) {
    // A constant series: centre it.
    double d = std::abs(lo) * 0.1;
    if (!(d > 0) || !std::isfinite(d)) d = 1;
    return {lo - d, hi + d};
  }
  return {lo - span * 0.06, hi + span * 0.06};
}

// Maps a value of `r` onto [a, b] (b may be less than a, for y).
double Map(double v, Range r, double a, double b) {
  return a + (v - r.lo) / (r.hi - r.lo) * (b - a);
}

void Line(std::string* svg, double x1, double y1, double x2, double y2, const std::string& attrs) {
  absl::StrAppend(svg, "<line x1=\"", Num(x1), "\" y1=\"", Num(y1), "\" x2=\"", Num(x2), "\" y2=\"",
                  Num(y2), "\" ", attrs, "/>\n");
}

void Text(std::string* svg, double x, double y, const std::string& attrs, const std::string& text) {
  absl::StrAppend(svg, "<text x=\"", Num(x), "\" y=\"", Num(y), "\" ", attrs, ">", Escape(text),
                  "</text>\n");
}

// Where a panel lies on the page and what its axes span.
struct Frame {
  double left, right, top, bottom;
  Range xr, yr;
};

// How many of the panel's points can be drawn (finite; positive on a log axis).
int CountDrawable(const Panel& p) {
  int drawable = 0;
  for (const Series& s : p.series) {
    for (const Point& pt : s.points) {
      double y;
      drawable += Drawable(p, pt.y, &y);
    }
  }
  return drawable;
}

// The title, with how many values could not be drawn, and the series' legend right-aligned
// on its line.
void DrawTitle(std::string* svg, const Panel& p, const Frame& f, int undrawable) {
  std::string title = p.title;
  if (undrawable > 0) {
    absl::StrAppend(&title, "  (", undrawable,
                    p.log2 ? " non-positive or non-finite" : " non-finite",
                    undrawable == 1 ? " value" : " values", " not plotted)");
  }
  Text(svg, f.left, f.top - 10, "font-size=\"13\" font-weight=\"bold\" fill=\"#212529\"", title);
  double lx = f.right;
  for (auto it = p.series.rbegin(); it != p.series.rend(); ++it) {
    lx -= 8.0 + 7.0 * static_cast<double>(it->label.size());
    Text(svg, lx, f.top - 10, "font-size=\"11\" fill=\"#495057\"", it->label);
    Line(svg, lx - 22, f.top - 14, lx - 4, f.top - 14,
         absl::StrCat("stroke=\"", it->color, "\" stroke-width=\"2\""));
    lx -= 30;
  }
}

// Grid, ticks and their labels; the x axis's name under the last panel only.
void DrawAxes(std::string* svg, const Panel& p, const Frame& f, bool last) {
  const std::vector<double> yticks =
      p.log2 ? LinearTicks(f.yr, 5, /*integers=*/true) : LinearTicks(f.yr, 5, /*integers=*/false);
  for (double t : yticks) {
    const double y = Map(t, f.yr, f.bottom, f.top);
    Line(svg, f.left, y, f.right, y, absl::StrCat("stroke=\"", kGridColor, "\""));
    Line(svg, f.left - 4, y, f.left, y, absl::StrCat("stroke=\"", kAxisColor, "\""));
    Text(svg, f.left - 7, y + 4, "font-size=\"11\" text-anchor=\"end\" fill=\"#495057\"",
         p.log2 ? Pow2Label(t) : TickLabel(t));
  }
  for (double t : LinearTicks(f.xr, 8, /*integers=*/true)) {
    const double x = Map(t, f.xr, f.left, f.right);
    Line(svg, x, f.top, x, f.bottom, absl::StrCat("stroke=\"", kGridColor, "\""));
    Line(svg, x, f.bottom, x, f.bottom + 4, absl::StrCat("stroke=\"", kAxisColor, "\""));
    Text(svg, x, f.bottom + 17, "font-size=\"11\" text-anchor=\"middle\" fill=\"#495057\"",
         TickLabel(t));
  }
  if (last) {
    Text(svg, (f.left + f.right) / 2, f.bottom + 38,
         "font-size=\"12\" text-anchor=\"middle\" fill=\"#212529\"", "optimizer_update_id");
  }
}

// Skipped and aborted windows, across the whole panel height.
void DrawMarks(std::string* svg, const std::vector<Mark>& marks, const Frame& f) {
  for (const Mark& m : marks) {
    const double x = Map(m.x, f.xr, f.left, f.right);
    absl::StrAppend(svg, "<line class=\"", m.abort ? "mark-abort" : "mark-skip", "\" x1=\"", Num(x),
                    "\" y1=\"", Num(f.top), "\" x2=\"", Num(x), "\" y2=\"", Num(f.bottom),
                    "\" stroke=\"", m.abort ? kAbortColor : kSkipColor,
                    "\" stroke-width=\"1.5\" stroke-opacity=\"0.7\"><title>", Escape(m.tooltip),
                    "</title></line>\n");
  }
}

// One series: a polyline per run of drawable points going forward in x, and dots on its
// data points when `dots` (a single point would otherwise be invisible).
void DrawSeries(std::string* svg, const Panel& p, const Series& s, const Frame& f, bool dots) {
  std::vector<std::vector<std::pair<double, double>>> runs(1);
  double prev_x = -HUGE_VAL;
  for (const Point& pt : s.points) {
    double y;
    if (!Drawable(p, pt.y, &y) || pt.x < prev_x) {
      if (!runs.back().empty()) runs.emplace_back();
      if (!Drawable(p, pt.y, &y)) continue;
    }
    const double px = Map(pt.x, f.xr, f.left, f.right);
    const double py = Map(y, f.yr, f.bottom, f.top);
    if (s.steps && !runs.back().empty()) runs.back().emplace_back(px, runs.back().back().second);
    runs.back().emplace_back(px, py);
    prev_x = pt.x;
  }
  for (const auto& run : runs) {
    if (run.size() < 2) continue;
    std::string points;
    for (const auto& [x, y] : run) {
      absl::StrAppend(&points, points.empty() ? "" : " ", Num(x), ",", Num(y));
    }
    absl::StrAppend(svg, "<polyline class=\"series\" fill=\"none\" stroke=\"", s.color,
                    "\" stroke-width=\"1.6\" stroke-linejoin=\"round\" points=\"", points,
                    "\"/>\n");
  }
  if (!dots) return;
  for (const auto& run : runs) {
    for (size_t i = 0; i < run.size(); ++i) {
      if (s.steps && i % 2 == 1) continue;  // the corners of a step are not data
      absl::StrAppend(svg, "<circle cx=\"", Num(run[i].first), "\" cy=\"", Num(run[i].second),
                      "\" r=\"2.2\" fill=\"", s.color, "\"/>\n");
    }
  }
}

void DrawPanel(std::string* svg, const Panel& p, int index, double top, Range xr,
               const std::vector<Mark>& marks, bool last) {
  const Frame f{kLeft, kWidth - kRight, top, top + kPanelHeight, xr, YRange(p)};
  absl::StrAppend(svg, "<g class=\"panel\" id=\"panel-", index, "\">\n");
  const int drawable = CountDrawable(p);
  int points = 0;
  for (const Series& s : p.series) points += static_cast<int>(s.points.size());
  DrawTitle(svg, p, f, points - drawable);
  DrawAxes(svg, p, f, last);
  DrawMarks(svg, marks, f);
  for (const Series& s : p.series) DrawSeries(svg, p, s, f, /*dots=*/drawable <= 120);
  if (drawable == 0) {
    Text(svg, (f.left + f.right) / 2, (f.top + f.bottom) / 2 + 4,
         "font-size=\"12\" text-anchor=\"middle\" fill=\"#868e96\"", "no data");
  }
  absl::StrAppend(svg, "<rect x=\"", Num(f.left), "\" y=\"", Num(f.top), "\" width=\"",
                  Num(f.right - f.left), "\" height=\"", Num(kPanelHeight),
                  "\" fill=\"none\" stroke=\"", kAxisColor, "\"/>\n</g>\n");
}

// The panels as the log fills them, before they are laid out.
struct Panels {
  Panel loss{"loss", false, {{"loss", kLossColor, {}, false}}};
  Panel lr{"learning rate", false, {{"lr", kLrColor, {}, false}}};
  Panel scale{"loss scale (log\u2082 axis)", true, {{"loss scale", kScaleColor, {}, true}}};
  Panel norm{"gradient norm",
             false,
             {{"pre-clip", kPreClipColor, {}, false}, {"post-clip", kPostClipColor, {}, false}}};
  Panel interval{
      "seconds between committed updates", false, {{"interval", kIntervalColor, {}, false}}};
  Panel scaled{"gradient norm before unscale (log\u2082 axis; \u00f7 pre-clip = loss scale)",
               true,
               {{"scaled", kScaledColor, {}, false}}};
  Series eval{"eval (held-out)", kEvalColor, {}, false};

  // A commit's values, at x = its optimizer_update_id.
  void AddCommit(const v1::UpdateRecord& r) {
    const double id = static_cast<double>(r.optimizer_update_id());
    loss.series[0].points.push_back({id, r.loss()});
    if (r.has_eval_loss()) eval.points.push_back({id, r.eval_loss()});
    lr.series[0].points.push_back({id, r.learning_rate()});
    norm.series[0].points.push_back({id, r.grad_norm_pre_clip()});
    norm.series[1].points.push_back({id, r.grad_norm_post_clip()});
    scale.series[0].points.push_back({id, r.loss_scale()});
    if (r.has_update_interval_seconds()) {
      interval.series[0].points.push_back({id, r.update_interval_seconds()});
    }
    if (r.has_grad_norm_scaled()) scaled.series[0].points.push_back({id, r.grad_norm_scaled()});
  }

  // Top to bottom, the optional ones only with data.
  std::vector<Panel> InPageOrder() const {
    Panel with_eval = loss;
    // The held-out loss shares the training loss's panel (same units), only in jobs with
    // spec.eval.
    if (!eval.points.empty()) with_eval.series.push_back(eval);
    std::vector<Panel> panels = {with_eval, lr, scale, norm};
    // The probe's panel only for a job with a loss scaler.
    if (!scaled.series[0].points.empty()) panels.push_back(scaled);
    panels.push_back(interval);
    return panels;
  }
};

// What the subtitle counts.
struct Counts {
  int64_t commits = 0, skips = 0, aborts = 0;
  int64_t dropped = 0, dropped_epochs = 0;  // samples left out by batch.tail drop, and epochs
};

// The log drawn: its panels, the marks of its skipped and aborted windows, its counts.
struct Plot {
  std::vector<Panel> panels;
  std::vector<Mark> marks;
  Counts counts;
};

// Skipped and aborted windows become marks at x = optimizer_update_id + 0.5.
Plot ReadLog(const std::vector<v1::UpdateRecord>& records) {
  Panels panels;
  Plot plot;
  Counts& n = plot.counts;
  for (const v1::UpdateRecord& r : records) {
    if (r.has_dropped_tail()) {
      n.dropped += r.dropped_tail().samples();
      ++n.dropped_epochs;
    }
    const v1::WindowOutcome outcome = OutcomeOf(r);
    if (outcome == v1::COMMIT) {
      ++n.commits;
      panels.AddCommit(r);
      continue;
    }
    const bool abort = outcome != v1::SKIP;
    (abort ? n.aborts : n.skips)++;
    const double x = static_cast<double>(r.optimizer_update_id()) + 0.5;
    plot.marks.push_back(
        {x, abort,
         absl::StrCat("window ", r.window_id(), " (generation ", r.generation(),
                      "): ", OutcomeText(r), " after update ", r.optimizer_update_id())});
    // A skip can change the scale (overflow backs it off); an abort changes nothing.
    if (!abort) panels.scale.series[0].points.push_back({x, r.loss_scale()});
  }
  plot.panels = panels.InPageOrder();
  return plot;
}

// One x range for every panel: the data and the marks.
Range XRange(const Plot& plot) {
  double xlo = HUGE_VAL, xhi = -HUGE_VAL;
  for (const Panel& p : plot.panels) {
    for (const Series& s : p.series) {
      for (const Point& pt : s.points) {
        xlo = std::min(xlo, pt.x);
        xhi = std::max(xhi, pt.x);
      }
    }
  }
  for (const Mark& m : plot.marks) {
    xlo = std::min(xlo, m.x);
    xhi = std::max(xhi, m.x);
  }
  if (xlo > xhi) return Range{0, 1};
  const double pad = std::max(0.5, (xhi - xlo) * 0.01);
  return {xlo - pad, xhi + pad};
}

// The document's opening, its title (job id and name), the subtitle's counts and the legend
// of the marks.
void DrawHeader(std::string* svg, const PlotInput& input, const Counts& n, double height) {
  absl::StrAppend(svg, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n",
                  "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"", Num(kWidth), "\" height=\"",
                  Num(height), "\" viewBox=\"0 0 ", Num(kWidth), " ", Num(height),
                  "\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\">\n");
  std::string title = input.job_id;
  if (!input.job_name.empty()) absl::StrAppend(&title, " \u2014 ", input.job_name);
  absl::StrAppend(svg, "<title>", Escape(title), "</title>\n");
  absl::StrAppend(svg, "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n");
  Text(svg, kLeft, 30, "font-size=\"18\" font-weight=\"bold\" fill=\"#212529\"", title);
  std::string subtitle = absl::StrCat(
      input.records.size(), input.records.size() == 1 ? " window: " : " windows: ", n.commits,
      " committed, ", n.skips, " skipped, ", n.aborts, " aborted");
  if (n.dropped_epochs > 0) {
    absl::StrAppend(&subtitle, "; batch.tail drop left out ", n.dropped, " samples in ",
                    n.dropped_epochs, n.dropped_epochs == 1 ? " epoch" : " epochs");
  }
  Text(svg, kLeft, 52, "font-size=\"12\" fill=\"#495057\"", subtitle);
  const double ly = 52;
  double lx = kWidth - kRight - 260;
  for (const auto& [color, label] :
       {std::pair<const char*, const char*>{kSkipColor, "skipped window"},
        {kAbortColor, "aborted window"}}) {
    Line(svg, lx, ly - 12, lx, ly + 2,
         absl::StrCat("stroke=\"", color, "\" stroke-width=\"2\" stroke-opacity=\"0.8\""));
    Text(svg, lx + 7, ly, "font-size=\"12\" fill=\"#495057\"", label);
    lx += 130;
  }
}

}  // namespace

std::string RenderPlotSvg(const PlotInput& input) {
  const Plot plot = ReadLog(input.records);
  const Range xr = XRange(plot);
  const size_t count = plot.panels.size();
  const double height = kHeader + count * (kPanelHeight + kPanelGap) + kFooter;
  std::string svg;
  DrawHeader(&svg, input, plot.counts, height);
  for (size_t i = 0; i < count; ++i) {
    DrawPanel(&svg, plot.panels[i], static_cast<int>(i),
              kHeader + kPanelGap / 2 + i * (kPanelHeight + kPanelGap), xr, plot.marks,
              i + 1 == count);
  }
  absl::StrAppend(&svg, "</svg>\n");
  return svg;
}

}  // namespace trainstep::client
