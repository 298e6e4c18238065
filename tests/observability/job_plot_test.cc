// `trainstep job plot`: the SVG renderer on chosen logs (empty, one record, constant,
// non-finite norms, skips and aborts, a name with markup in it), and the command end to end
// against the coordinator binary after a run with simulated workers. Each picture is parsed
// as XML (a small checker: balanced tags, quoted attributes, known entities) and its
// coordinates must be finite. If rsvg-convert or chromium is installed, one picture is also
// rendered to PNG; without them that step is skipped.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/args.h"
#include "client/cli.h"
#include "client/plot.h"
#include "tests/observability/observability_util.h"
#include "tests/observability/observed_job.h"

namespace trainstep::client {
namespace {

namespace obs = ::trainstep::obs;

struct Element {
  std::string name;
  std::map<std::string, std::string> attributes;
  std::string text;  // direct character data
};

// A strict-enough XML reader for what RenderPlotSvg writes: prolog, elements, attributes in
// double quotes, text with the five predefined entities. Returns every element in document
// order, or an error naming the offset.
absl::StatusOr<std::vector<Element>> ParseXml(const std::string& xml) {
  std::vector<Element> out;
  std::vector<std::pair<std::string, size_t>> open;  // name, index in out
  size_t i = 0;
  auto fail = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(why, " at offset ", i, ": ", xml.substr(i, 60)));
  };
  auto check_text = [&](const std::string& text) -> absl::Status {
    for (size_t k = 0; k < text.size(); ++k) {
      if (text[k] == '<') return fail("raw < in text");
      if (text[k] == '&') {
        const size_t semi = text.find(';', k);
        if (semi == std::string::npos) return fail("unterminated entity");
        const std::string e = text.substr(k, semi - k + 1);
        if (e != "&amp;" && e != "&lt;" && e != "&gt;" && e != "&quot;" && e != "&apos;") {
          return fail(absl::StrCat("unknown entity ", e));
        }
      }
    }
    return absl::OkStatus();
  };
  bool root_closed = false;
  while (i < xml.size()) {
    if (xml[i] != '<') {
      const size_t next = xml.find('<', i);
      const std::string text =
          xml.substr(i, next == std::string::npos ? std::string::npos : next - i);
      if (absl::Status s = check_text(text); !s.ok()) return s;
      if (open.empty() && !absl::StripAsciiWhitespace(text).empty())
        return fail("text outside the root");
      if (!open.empty()) out[open.back().second].text += text;
      if (next == std::string::npos) break;
      i = next;
      continue;
    }
    if (xml.compare(i, 5, "<?xml") == 0) {
      if (i != 0) return fail("prolog not first");
      const size_t end = xml.find("?>", i);
      if (end == std::string::npos) return fail("unterminated prolog");
      i = end + 2;
      continue;
    }
    if (xml.compare(i, 2, "</") == 0) {
      const size_t end = xml.find('>', i);
      if (end == std::string::npos) return fail("unterminated end tag");
      const std::string name = xml.substr(i + 2, end - i - 2);
      if (open.empty() || open.back().first != name) {
        return fail(
            absl::StrCat("</", name, "> closes ", open.empty() ? "nothing" : open.back().first));
      }
      open.pop_back();
      if (open.empty()) root_closed = true;
      i = end + 1;
      continue;
    }
    if (root_closed) return fail("a second root element");
    // A start tag.
    ++i;
    Element e;
    while (i < xml.size() && (absl::ascii_isalnum(xml[i]) || xml[i] == '-' || xml[i] == ':')) {
      e.name += xml[i++];
    }
    if (e.name.empty()) return fail("no element name");
    bool self_closing = false;
    while (true) {
      while (i < xml.size() && absl::ascii_isspace(xml[i])) ++i;
      if (i >= xml.size()) return fail("unterminated start tag");
      if (xml.compare(i, 2, "/>") == 0) {
        self_closing = true;
        i += 2;
        break;
      }
      if (xml[i] == '>') {
        ++i;
        break;
      }
      std::string attr;
      while (i < xml.size() &&
             (absl::ascii_isalnum(xml[i]) || xml[i] == '-' || xml[i] == ':' || xml[i] == '_')) {
        attr += xml[i++];
      }
      if (attr.empty() || i + 1 >= xml.size() || xml[i] != '=' || xml[i + 1] != '"') {
        return fail("attribute without =\"...\"");
      }
      i += 2;
      const size_t close = xml.find('"', i);
      if (close == std::string::npos) return fail("unterminated attribute");
      const std::string value = xml.substr(i, close - i);
      if (absl::Status s = check_text(value); !s.ok()) return s;
      if (!e.attributes.emplace(attr, value).second) return fail(absl::StrCat("duplicate ", attr));
      i = close + 1;
    }
    out.push_back(e);
    if (!self_closing) open.emplace_back(e.name, out.size() - 1);
  }
  if (!open.empty())
    return absl::InvalidArgumentError(absl::StrCat("<", open.back().first, "> never closed"));
  if (out.empty() || out[0].name != "svg")
    return absl::InvalidArgumentError("the root is not <svg>");
  return out;
}

// Every number in a coordinate-like attribute must be finite.
void ExpectFiniteCoordinates(const std::vector<Element>& elements) {
  static const std::set<std::string> kNumeric = {"x",  "y",  "x1", "y1",    "x2",    "y2",
                                                 "cx", "cy", "r",  "width", "height"};
  for (const Element& e : elements) {
    for (const auto& [attr, value] : e.attributes) {
      if (attr == "points" || attr == "viewBox") {
        for (absl::string_view n :
             absl::StrSplit(value, absl::ByAnyChar(" ,"), absl::SkipEmpty())) {
          double v;
          EXPECT_TRUE(absl::SimpleAtod(n, &v) && std::isfinite(v))
              << e.name << " " << attr << "=" << value;
        }
      } else if (kNumeric.count(attr) && !absl::EndsWith(value, "%")) {
        double v;
        EXPECT_TRUE(absl::SimpleAtod(value, &v) && std::isfinite(v))
            << e.name << " " << attr << "=" << value;
      }
    }
  }
}

std::vector<const Element*> WithClass(const std::vector<Element>& elements,
                                      const std::string& cls) {
  std::vector<const Element*> out;
  for (const Element& e : elements) {
    auto it = e.attributes.find("class");
    if (it != e.attributes.end() && it->second == cls) out.push_back(&e);
  }
  return out;
}

std::string AllText(const std::vector<Element>& elements) {
  std::string s;
  for (const Element& e : elements) absl::StrAppend(&s, e.text, "\n");
  return s;
}

v1::UpdateRecord Commit(int64_t update, double loss, double norm) {
  v1::UpdateRecord r;
  r.set_window_id(update);
  r.set_generation(1);
  r.set_outcome("commit");
  r.set_optimizer_update_id(update);
  r.set_loss(loss);
  r.set_learning_rate(1e-3);
  r.set_loss_scale(65536);
  r.set_grad_norm_pre_clip(norm);
  r.set_grad_norm_post_clip(std::min(norm, 1.0));
  return r;
}

v1::UpdateRecord NotCommitted(int64_t window, int64_t after_update, const std::string& outcome,
                              const std::string& reason, double scale) {
  v1::UpdateRecord r;
  r.set_window_id(window);
  r.set_generation(1);
  r.set_outcome(outcome);
  r.set_reason(reason);
  r.set_optimizer_update_id(after_update);
  r.set_loss_scale(scale);
  r.set_grad_norm_pre_clip(std::numeric_limits<double>::infinity());
  r.set_grad_norm_post_clip(0);
  r.set_loss(std::nan(""));
  return r;
}

std::vector<Element> MustParse(const std::string& svg) {
  absl::StatusOr<std::vector<Element>> e = ParseXml(svg);
  EXPECT_TRUE(e.ok()) << e.status() << "\n" << svg.substr(0, 2000);
  return e.ok() ? *e : std::vector<Element>{};
}

// A log with everything in it: the picture has the five panels, a skip and an abort mark
// with their tooltips, the title with the name escaped, and the non-finite values counted.
TEST(PlotSvgTest, MarksSkipsAndAbortsAndEscapesTheName) {
  PlotInput in;
  in.job_id = "job-7";
  in.job_name = "tiny <gpt> & \"friends\"";
  for (int64_t u = 1; u <= 5; ++u) in.records.push_back(Commit(u, 3.0 - 0.1 * u, 0.5 + u));
  in.records.push_back(NotCommitted(6, 5, "skip", "OVERFLOW", 32768));
  in.records.push_back(NotCommitted(7, 5, "abort", "WORKER_LOST", 32768));
  in.records.push_back(Commit(6, 2.4, std::nan("")));
  in.records.back().set_window_id(8);
  const std::string svg = RenderPlotSvg(in);
  const std::vector<Element> el = MustParse(svg);
  ASSERT_FALSE(el.empty());
  ExpectFiniteCoordinates(el);
  EXPECT_EQ(el[0].attributes.at("xmlns"), "http://www.w3.org/2000/svg");
  EXPECT_EQ(WithClass(el, "panel").size(), 5u);  // no scaled-norm panel without a scaler
  // One mark per panel for each non-committed window.
  const auto skips = WithClass(el, "mark-skip");
  const auto aborts = WithClass(el, "mark-abort");
  EXPECT_EQ(skips.size(), 5u);
  EXPECT_EQ(aborts.size(), 5u);
  ASSERT_FALSE(skips.empty());
  ASSERT_FALSE(aborts.empty());
  EXPECT_NE(skips[0]->attributes.at("stroke"), aborts[0]->attributes.at("stroke"));
  // Between update 5 and update 6 on the x axis.
  const std::string text = AllText(el);
  EXPECT_TRUE(absl::StrContains(text, "window 6 (generation 1): skip OVERFLOW after update 5"))
      << text;
  EXPECT_TRUE(absl::StrContains(text, "window 7 (generation 1): abort WORKER_LOST")) << text;
  EXPECT_TRUE(absl::StrContains(svg, "job-7 \u2014 tiny &lt;gpt&gt; &amp; &quot;friends&quot;"));
  EXPECT_TRUE(absl::StrContains(text, "skipped window"));
  EXPECT_TRUE(absl::StrContains(text, "aborted window"));
  EXPECT_TRUE(absl::StrContains(text, "8 windows: 6 committed, 1 skipped, 1 aborted")) << text;
  // The NaN norms of update 6 (pre- and post-clip) are not plotted but said.
  EXPECT_TRUE(absl::StrContains(text, "gradient norm  (2 non-finite values not plotted)")) << text;
  for (const char* label : {"loss", "learning rate", "loss scale (log\u2082 axis)", "pre-clip",
                            "post-clip", "optimizer_update_id"}) {
    EXPECT_TRUE(absl::StrContains(text, label)) << label;
  }
  EXPECT_FALSE(WithClass(el, "series").empty());
  // x positions: the skip mark lies between the x of update 5 and of update 6.
  const double mark_x = std::stod(skips[0]->attributes.at("x1"));
  std::vector<double> dots;  // the loss panel's points: updates 1..6
  for (const Element& e : el) {
    if (e.name == "circle" && e.attributes.at("fill") == "#1f77b4") {
      dots.push_back(std::stod(e.attributes.at("cx")));
    }
  }
  std::sort(dots.begin(), dots.end());
  ASSERT_EQ(dots.size(), 6u);
  EXPECT_GT(mark_x, dots[4]);
  EXPECT_LT(mark_x, dots[5]);
}

// Catches: the update interval or the scaled-norm probe missing from the picture (or the
// probe's panel drawn for a job without a scaler), a dropped tail not mentioned.
TEST(PlotSvgTest, IntervalScaledNormAndDroppedTail) {
  PlotInput in;
  in.job_id = "job-2";
  for (int64_t u = 1; u <= 4; ++u) {
    in.records.push_back(Commit(u, 2.0, 0.25 * u));
    in.records.back().set_grad_norm_scaled(65536 * 0.25 * u);
    in.records.back().set_update_interval_seconds(1.5 + u);
  }
  in.records.back().mutable_dropped_tail()->set_samples(4);
  const std::vector<Element> el = MustParse(RenderPlotSvg(in));
  ASSERT_FALSE(el.empty());
  ExpectFiniteCoordinates(el);
  EXPECT_EQ(WithClass(el, "panel").size(), 6u);
  const std::string text = AllText(el);
  for (const char* label : {"seconds between committed updates", "gradient norm before unscale",
                            "batch.tail drop left out 4 samples in 1 epoch"}) {
    EXPECT_TRUE(absl::StrContains(text, label)) << label << "\n" << text;
  }
  size_t interval_dots = 0, scaled_dots = 0;
  for (const Element& e : el) {
    if (e.name != "circle") continue;
    interval_dots += e.attributes.at("fill") == "#bcbd22";
    scaled_dots += e.attributes.at("fill") == "#7f7f7f";
  }
  EXPECT_EQ(interval_dots, 4u);
  EXPECT_EQ(scaled_dots, 4u);
}

// Degenerate logs still give a whole, finite picture.
TEST(PlotSvgTest, EmptyOneRecordConstantAndNonFinite) {
  std::vector<std::pair<std::string, std::vector<v1::UpdateRecord>>> cases;
  cases.push_back({"empty", {}});
  cases.push_back({"one record", {Commit(1, 2.0, 1.0)}});
  std::vector<v1::UpdateRecord> constant;
  for (int u = 1; u <= 10; ++u) constant.push_back(Commit(u, 2.0, 0.0));
  cases.push_back({"constant", constant});
  std::vector<v1::UpdateRecord> nonfinite;
  for (int u = 1; u <= 4; ++u) {
    v1::UpdateRecord r =
        Commit(u, u % 2 ? std::nan("") : 1.0, std::numeric_limits<double>::infinity());
    r.set_loss_scale(u == 3 ? 0 : -std::numeric_limits<double>::infinity());
    r.set_learning_rate(u % 2 ? 1.7e308 : -1.7e308);  // a span that overflows a double
    nonfinite.push_back(r);
  }
  cases.push_back({"non-finite", nonfinite});
  cases.push_back({"only skips",
                   {NotCommitted(1, 0, "skip", "EMPTY_WINDOW", 1),
                    NotCommitted(2, 0, "skip", "EMPTY_WINDOW", 1)}});
  for (const auto& [name, records] : cases) {
    SCOPED_TRACE(name);
    PlotInput in;
    in.job_id = "job-1";
    in.records = records;
    const std::string svg = RenderPlotSvg(in);
    EXPECT_FALSE(absl::StrContains(svg, "nan")) << svg;
    EXPECT_FALSE(absl::StrContains(svg, "inf\"")) << svg;
    const std::vector<Element> el = MustParse(svg);
    ASSERT_FALSE(el.empty());
    ExpectFiniteCoordinates(el);
    EXPECT_EQ(WithClass(el, "panel").size(), 5u);
  }
  PlotInput empty;
  empty.job_id = "job-1";
  EXPECT_TRUE(absl::StrContains(AllText(MustParse(RenderPlotSvg(empty))), "no data"));
}

// Renders a picture to PNG with whatever SVG renderer is installed; skipped without one.
TEST(PlotSvgTest, RendersToPngIfARendererIsInstalled) {
  PlotInput in;
  in.job_id = "job-7";
  in.job_name = "render";
  for (int64_t u = 1; u <= 40; ++u) in.records.push_back(Commit(u, 3.0 / u, 1.0 + (u % 5)));
  in.records.push_back(NotCommitted(41, 40, "skip", "OVERFLOW", 32768));
  const std::string dir =
      (std::filesystem::temp_directory_path() / absl::StrCat("trainstep-plot-", getpid())).string();
  std::filesystem::create_directories(dir);
  ASSERT_TRUE(obs::WriteFile(dir + "/plot.svg", RenderPlotSvg(in)).ok());
  const std::string png = dir + "/plot.png";
  obs::ProcessResult r;
  if (std::optional<std::string> rsvg = obs::FindProgram("rsvg-convert")) {
    r = obs::RunProgram({*rsvg, "-o", png, dir + "/plot.svg"});
  } else {
    std::optional<std::string> chromium = obs::FindProgram("chromium");
    if (!chromium.has_value()) chromium = obs::FindProgram("chromium-browser");
    if (!chromium.has_value()) {
      std::filesystem::remove_all(dir);
      GTEST_SKIP() << "neither rsvg-convert nor chromium is installed; the SVG checks above "
                      "still ran";
    }
    r = obs::RunProgram({*chromium, "--headless", "--no-sandbox", "--disable-gpu",
                         absl::StrCat("--screenshot=", png), "--window-size=960,1000",
                         absl::StrCat("file://", dir, "/plot.svg")},
                        "", absl::Seconds(60));
  }
  EXPECT_EQ(r.exit_code, 0) << r.output;
  const std::string bytes = obs::ReadFileOrEmpty(png);
  EXPECT_GT(bytes.size(), 1000u);
  EXPECT_EQ(bytes.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  std::filesystem::remove_all(dir);
}

TEST(PlotArgsTest, NeedsOutAndOnlyPlotTakesIt) {
  ParsedArgs p = ParseArgs({"job", "plot", "job-3", "--out", "a.svg"}, "");
  ASSERT_EQ(p.kind, ParsedArgs::Kind::kRun) << p.text;
  EXPECT_EQ(p.invocation.command, Command::kJobPlot);
  EXPECT_EQ(p.invocation.job_id, "job-3");
  EXPECT_EQ(p.invocation.out_path, "a.svg");
  EXPECT_EQ(ParseArgs({"job", "plot", "--out=-", "job-3"}, "").invocation.out_path, "-");
  p = ParseArgs({"job", "plot", "job-3"}, "");
  EXPECT_EQ(p.kind, ParsedArgs::Kind::kUsageError);
  EXPECT_TRUE(absl::StrContains(p.text, "--out FILE.svg")) << p.text;
  p = ParseArgs({"job", "logs", "job-3", "--out", "a.svg"}, "");
  EXPECT_EQ(p.kind, ParsedArgs::Kind::kUsageError);
  EXPECT_TRUE(absl::StrContains(p.text, "--out is not a flag of 'job logs'")) << p.text;
  p = ParseArgs({"job", "plot", "--help"}, "");
  ASSERT_EQ(p.kind, ParsedArgs::Kind::kHelp);
  EXPECT_TRUE(absl::StrContains(p.text, "trainstep job plot ID --out FILE.svg")) << p.text;
  EXPECT_TRUE(absl::StrContains(p.text, "Skipped windows are marked")) << p.text;
  EXPECT_TRUE(absl::StrContains(UsageText(""), "job plot ID")) << UsageText("");
  EXPECT_TRUE(absl::StrContains(UsageText("job"), "plot ID")) << UsageText("job");
}

// The command against the coordinator binary after a run with skips: the file is written
// whole and has a mark per skipped window in each panel; an unknown job exits 4.
TEST(JobPlotCommandTest, PlotsARealRun) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / absl::StrCat("trainstep-plot-cli-", getpid()))
          .string();
  obs::ObservedJobOptions options;
  options.windows = 30;
  absl::StatusOr<std::unique_ptr<obs::ObservedJob>> started = obs::ObservedJob::Start(dir, options);
  ASSERT_TRUE(started.ok()) << started.status();
  obs::ObservedJob& job = **started;
  ASSERT_TRUE(job.SubmitAndRun().ok());
  ASSERT_TRUE(job.WaitForEnd(absl::Seconds(60)).ok());
  absl::StatusOr<std::vector<v1::UpdateRecord>> log = job.Updates();
  ASSERT_TRUE(log.ok());
  size_t skipped = 0;
  for (const v1::UpdateRecord& r : *log) skipped += r.outcome() == "skip";
  ASSERT_GT(skipped, 0u);

  const std::string file = dir + "/plot.svg";
  std::istringstream in;
  std::ostringstream out, err;
  ProcessEnvironment env;
  const int rc =
      RunCli({"job", "plot", job.job_id(), "--out", file, "--coordinator", job.address()}, env, in,
             out, err);
  ASSERT_EQ(rc, 0) << err.str();
  EXPECT_TRUE(absl::StrContains(err.str(), absl::StrCat("wrote ", file))) << err.str();
  EXPECT_FALSE(std::filesystem::exists(file + ".tmp"));
  const std::string svg = obs::ReadFileOrEmpty(file);
  const std::vector<Element> el = MustParse(svg);
  ASSERT_FALSE(el.empty());
  ExpectFiniteCoordinates(el);
  EXPECT_EQ(WithClass(el, "mark-skip").size(), WithClass(el, "panel").size() * skipped);
  EXPECT_TRUE(absl::StrContains(
      svg, absl::StrCat(job.job_id(), " \u2014 observability &lt;demo&gt; &amp; co")));

  // To stdout.
  std::ostringstream out2, err2;
  EXPECT_EQ(RunCli({"job", "plot", job.job_id(), "--out", "-", "--coordinator", job.address()}, env,
                   in, out2, err2),
            0);
  EXPECT_EQ(out2.str(), svg);

  std::ostringstream out3, err3;
  EXPECT_EQ(RunCli({"job", "plot", "job-999", "--out", file, "--coordinator", job.address()}, env,
                   in, out3, err3),
            kExitNotFound)
      << err3.str();
  started->reset();  // stops the coordinator before its directory goes
  if (!::testing::Test::HasFailure()) std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace trainstep::client
