// Tests for plot.h: the SVG's structure (well-formed, escaped title, one path per series, round
// tick labels, gaps and dots), the atomic write, and a real rendering in headless Chromium whose
// screenshot must show the lines in their colours. Not here: the PNG decoder's own tests
// (test_png_check.cpp).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "dptrain/core/errors.h"
#include "dptrain/report/plot.h"
#if defined(DPTRAIN_PLOT_RENDER_TEST)
#include "support/png_check.h"
#endif
#include "support/test_support.h"

namespace dptrain {
namespace {

using testing::read_text;
using testing::TempDir;

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// A run shaped like the book's: loss falling from 2.3, accuracies rising towards 0.9.
std::vector<EpochRecord> book_like_run(int epochs) {
  std::vector<EpochRecord> records;
  for (int e = 1; e <= epochs; ++e) {
    EpochRecord r;
    r.epoch = e;
    r.train_loss = 0.25 + 2.0 / (e + 0.2 * e * e);
    r.train_acc = 0.95 - 0.5 / e;
    r.test_loss = r.train_loss + 0.05;
    r.test_acc = 0.9 - 0.45 / e;
    r.seconds = 10;
    r.images_per_second = 6000;
    r.lr = 0.1;
    r.devices = "cpu,cpu";
    records.push_back(r);
  }
  return records;
}

// The `d` attribute of the path for `series`.
std::string series_path(const std::string& svg, const std::string& series) {
  const size_t at = svg.find("data-series=\"" + series + "\" d=\"");
  if (at == std::string::npos) return "(none)";
  const size_t start = svg.find("d=\"", at + 12) + 3;
  return svg.substr(start, svg.find('"', start) - start);
}

// "" when every tag is closed in order and every '&' starts an entity; else what is wrong.
// Enough XML for what render_training_plot writes: elements, attributes in double quotes, text.
std::string xml_problem(const std::string& xml) {
  std::vector<std::string> open;
  for (size_t i = 0; i < xml.size(); ++i) {
    if (xml[i] == '&') {
      const size_t semicolon = xml.find(';', i);
      const std::string entity = xml.substr(i, semicolon - i + 1);
      if (entity != "&amp;" && entity != "&lt;" && entity != "&gt;" && entity != "&quot;" &&
          entity != "&apos;") {
        return "a bare '&' at " + std::to_string(i);
      }
    }
    if (xml[i] == '>') return "a bare '>' at " + std::to_string(i);
    if (xml[i] != '<') continue;
    size_t end = i + 1;
    for (bool quoted = false; end < xml.size() && (quoted || xml[end] != '>'); ++end) {
      if (xml[end] == '<') return "a '<' inside a tag at " + std::to_string(end);
      if (xml[end] == '"') quoted = !quoted;
    }
    if (end >= xml.size()) return "an unclosed tag at " + std::to_string(i);
    const std::string tag = xml.substr(i + 1, end - i - 1);
    const std::string name = tag.substr(0, tag.find_first_of(" \n/"));
    if (tag[0] == '/') {
      const std::string closing = tag.substr(1);
      if (open.empty() || open.back() != closing) return "a stray </" + closing + ">";
      open.pop_back();
    } else if (tag.back() != '/') {
      open.push_back(name);
    }
    i = end;
  }
  return open.empty() ? "" : "<" + open.back() + "> is never closed";
}

// ============================================================================================
// The SVG text

TEST(PlotSvg, IsAStandaloneWellFormedSvg) {
  PlotOptions options;
  options.title = plot_title(0.1, 256, {"cpu"});
  const std::string svg = render_training_plot(book_like_run(10), options);
  EXPECT_EQ(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"760\" height=\"480\" "
                      "viewBox=\"0 0 760 480\"",
                      0),
            0u)
      << svg.substr(0, 200);
  EXPECT_EQ(svg.substr(svg.size() - 7), "</svg>\n");
  EXPECT_EQ(xml_problem(svg), "");
  EXPECT_EQ(count(svg, "class=\"series\""), 3u);
  for (const char* label : {"train loss", "train acc", "test acc", "epoch", "loss / accuracy"}) {
    EXPECT_NE(svg.find(std::string(">") + label + "</text>"), std::string::npos) << label;
  }
  EXPECT_NE(svg.find(">dptrain: ResNet-18 on Fashion-MNIST, lr 0.1, batch 256, [cpu]</text>"),
            std::string::npos);
  EXPECT_EQ(svg.find("nan"), std::string::npos);
  EXPECT_EQ(svg.find("inf"), std::string::npos);
}

TEST(PlotSvg, TitleIsEscapedForXml) {
  PlotOptions options;
  options.title = "a<b & \"c\" 'd' >\x01 caf\xc3\xa9 \xff";
  const std::string svg = render_training_plot(book_like_run(3), options);
  EXPECT_NE(svg.find(">a&lt;b &amp; &quot;c&quot; &apos;d&apos; &gt;  caf\xc3\xa9 ?</text>"),
            std::string::npos);
  EXPECT_EQ(svg.find("a<b"), std::string::npos);
  EXPECT_EQ(xml_problem(svg), "");
}

TEST(PlotSvg, TicksSitOnRoundValues) {
  const std::string svg = render_training_plot(book_like_run(10), PlotOptions{});
  // The book's x axis: epochs 1 to 10, ticks every 2. The y axis: 0 to 2 (the first loss is
  // 0.25 + 2 / 1.2 = 1.92), ticks every 0.5.
  for (const char* tick : {">2</text>", ">4</text>", ">10</text>", ">0.0</text>", ">0.5</text>",
                           ">1.0</text>", ">2.0</text>"}) {
    EXPECT_NE(svg.find(tick), std::string::npos) << tick;
  }
  EXPECT_EQ(svg.find(">3</text>"), std::string::npos);
  EXPECT_EQ(svg.find(">0.3</text>"), std::string::npos);
}

TEST(PlotSvg, LargeLossesWidenTheAxis) {
  std::vector<EpochRecord> records = book_like_run(4);
  records[0].train_loss = 1234.5;
  const std::string svg = render_training_plot(records, PlotOptions{});
  for (const char* tick : {">0</text>", ">500</text>", ">1000</text>", ">1500</text>"}) {
    EXPECT_NE(svg.find(tick), std::string::npos) << tick;
  }
  EXPECT_EQ(xml_problem(svg), "");
  // Every point of every series lies within the panel: none was pushed off the axis.
  const std::string d = series_path(svg, "train loss");
  EXPECT_EQ(count(d, "M"), 1u);
  EXPECT_EQ(count(d, "L"), 3u);
}

TEST(PlotSvg, NonFiniteValuesBreakTheLine) {
  std::vector<EpochRecord> records = book_like_run(6);
  records[2].train_loss = std::numeric_limits<double>::quiet_NaN();
  records[4].train_loss = std::numeric_limits<double>::infinity();
  records[5].test_acc = -std::numeric_limits<double>::infinity();
  const std::string svg = render_training_plot(records, PlotOptions{});
  EXPECT_EQ(xml_problem(svg), "");
  EXPECT_EQ(svg.find("nan"), std::string::npos);
  EXPECT_EQ(svg.find("inf"), std::string::npos);
  // train loss: epochs 1-2 joined, 4 alone (a dot), 6 alone (a dot).
  const std::string loss = series_path(svg, "train loss");
  EXPECT_EQ(count(loss, "M"), 3u) << loss;
  EXPECT_EQ(count(loss, "L"), 1u) << loss;
  EXPECT_EQ(count(svg, "<circle"), 2u);
  const std::string test_acc = series_path(svg, "test acc");
  EXPECT_EQ(count(test_acc, "M"), 1u);
  EXPECT_EQ(count(test_acc, "L"), 4u);
  // The y axis still comes from the finite values: 0 to 2, not stretched to infinity.
  EXPECT_NE(svg.find(">2.0</text>"), std::string::npos);
}

TEST(PlotSvg, OneEpochIsDrawnAsDots) {
  const std::string svg = render_training_plot(book_like_run(1), PlotOptions{});
  EXPECT_EQ(xml_problem(svg), "");
  EXPECT_EQ(count(svg, "<circle"), 3u);
  EXPECT_NE(svg.find(">1</text>"), std::string::npos);
  EXPECT_EQ(count(series_path(svg, "train acc"), "M"), 1u);
}

TEST(PlotSvg, NoRecordsGivesEmptyAxes) {
  const std::string svg = render_training_plot({}, PlotOptions{});
  EXPECT_EQ(xml_problem(svg), "");
  EXPECT_EQ(count(svg, "class=\"series\""), 3u);
  EXPECT_EQ(series_path(svg, "train loss"), "");
}

TEST(PlotSvg, PlannedEpochsAndRepeatedEpochs) {
  std::vector<EpochRecord> records = book_like_run(3);
  records.push_back(records[1]);  // epoch 2 again, as after a resume: the last one wins
  records.back().train_acc = 0.5;
  records.insert(records.begin(), records[2]);  // out of order
  PlotOptions options;
  options.epochs = 20;
  const std::string svg = render_training_plot(records, options);
  EXPECT_NE(svg.find(">20</text>"), std::string::npos);
  const std::string acc = series_path(svg, "train acc");
  EXPECT_EQ(count(acc, "L"), 2u) << acc;
  // Sorted by epoch: the x coordinates increase.
  double previous = -1;
  std::istringstream points(acc);
  for (std::string point; points >> point;) {
    const double x = std::stod(point.substr(1));
    EXPECT_GT(x, previous) << acc;
    previous = x;
  }
}

TEST(PlotSvg, SizeFromOptions) {
  PlotOptions options;
  options.width = 1000;
  options.height = 600;
  const std::string svg = render_training_plot(book_like_run(2), options);
  EXPECT_NE(svg.find("width=\"1000\" height=\"600\" viewBox=\"0 0 1000 600\""), std::string::npos);
  options.width = 100;
  EXPECT_THROW(render_training_plot(book_like_run(2), options), UsageError);
}

TEST(PlotSvg, TitleHelper) {
  EXPECT_EQ(plot_title(0.1, 256, {"cpu"}),
            "dptrain: ResNet-18 on Fashion-MNIST, lr 0.1, batch 256, [cpu]");
  EXPECT_EQ(plot_title(0.05, 512, {"cuda:0", "cuda:1"}),
            "dptrain: ResNet-18 on Fashion-MNIST, lr 0.05, batch 512, [cuda:0, cuda:1]");
}

// ============================================================================================
// Writing the file

TEST(PlotFile, PathMustEndInSvg) {
  EXPECT_NO_THROW(check_plot_path("out/plot.svg"));
  EXPECT_NO_THROW(check_plot_path("PLOT.SVG"));
  for (const std::string path : {"plot.png", "plot", "svg", ".svg", "plot.svg/x"}) {
    try {
      check_plot_path(path);
      ADD_FAILURE() << path << " was accepted";
    } catch (const UsageError& error) {
      const std::string message = error.what();
      EXPECT_NE(message.find("--plot " + path), std::string::npos) << message;
      EXPECT_NE(message.find(".svg"), std::string::npos) << message;
    }
  }
  TempDir dir;
  EXPECT_THROW(write_plot_atomically(dir.file("plot.png"), "<svg/>"), UsageError);
  EXPECT_FALSE(testing::path_exists(dir.file("plot.png")));
}

TEST(PlotFile, WritesAtomicallyAndReplaces) {
  TempDir dir;
  const std::string path = dir.file("plot.svg");
  write_plot_atomically(path, "<svg>old</svg>\n");
  const std::string svg = render_training_plot(book_like_run(5), PlotOptions{});
  write_plot_atomically(path, svg);
  EXPECT_EQ(read_text(path), svg);
  EXPECT_EQ(testing::temporary_files_in(dir.path()), std::vector<std::string>{});
}

TEST(PlotFile, UnwritablePathIsADataError) {
  TempDir dir;
  const std::string path = dir.file("missing/dir/plot.svg");
  testing::expect_data_error([&] { write_plot_atomically(path, "<svg/>"); },
                             {path, "No such file or directory"});
  // The target is a directory: refused before anything is written, and it stays.
  testing::make_directories(dir.file("taken.svg"));
  testing::make_directories(dir.file("taken.svg/inside"));
  testing::expect_data_error([&] { write_plot_atomically(dir.file("taken.svg"), "<svg/>"); },
                             {dir.file("taken.svg"), "is a directory"});
  EXPECT_TRUE(testing::path_exists(dir.file("taken.svg/inside")));
  EXPECT_EQ(testing::temporary_files_in(dir.path()), std::vector<std::string>{});
}

#if defined(DPTRAIN_PLOT_RENDER_TEST)  // tests/CMakeLists.txt: Chromium and libpng
// ============================================================================================
// Rendering in a real browser

// Chromium's path on $PATH, or "".
std::string find_chromium() {
  const char* path = std::getenv("PATH");
  std::istringstream dirs(path ? path : "");
  for (std::string dir; std::getline(dirs, dir, ':');) {
    for (const char* name : {"chromium", "chromium-browser"}) {
      const std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
      if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    }
  }
  return "";
}

// Screenshots `svg` in headless Chromium and decodes the PNG. The window is at least 800x600:
// Chromium 156 lays out a smaller headless window at a minimum size and the screenshot then
// shows only its corner.
testing::RgbImage screenshot(const TempDir& dir, const std::string& name, const std::string& svg,
                             int width, int height) {
  const std::string chromium = find_chromium();
  if (chromium.empty()) {
    throw std::runtime_error(
        "chromium is not installed (not on PATH); the plot test renders the SVG with it. "
        "Install it with scripts/install-deps.sh (Debian package chromium).");
  }
  const std::string svg_path = dir.file(name + ".svg");
  const std::string png_path = dir.file(name + ".png");
  write_plot_atomically(svg_path, svg);
  const std::string window =
      std::to_string(std::max(width, 800)) + "," + std::to_string(std::max(height, 600));
  const testing::CommandResult result = testing::run_command(
      {chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
       "--no-first-run", "--disable-extensions", "--user-data-dir=" + dir.file(name + "-profile"),
       "--window-size=" + window, "--screenshot=" + png_path, "file://" + svg_path},
      {{"HOME", dir.path()}, {"XDG_CONFIG_HOME", dir.path()}, {"XDG_CACHE_HOME", dir.path()}},
      /*timeout_seconds=*/120);
  if (result.timed_out || result.exit_code != 0 || !testing::is_regular_file(png_path)) {
    throw std::runtime_error(
        "chromium failed (exit " + std::to_string(result.exit_code) +
        (result.timed_out ? ", killed after 120 s" : "") + "), no screenshot at " + png_path +
        "; its error output ends:\n" +
        result.err.substr(result.err.size() > 3000 ? result.err.size() - 3000 : 0));
  }
  return testing::read_png(png_path);
}

TEST(PlotChromium, RenderedPlotShowsEverySeries) {
  TempDir dir;
  PlotOptions options;
  options.title = plot_title(0.1, 256, {"cpu", "cpu"});
  testing::RgbImage image;
  try {
    image = screenshot(dir, "plot", render_training_plot(book_like_run(10), options), options.width,
                       options.height);
  } catch (const std::exception& error) {
    FAIL() << error.what();
  }
  const testing::InkSummary ink = measure_ink(image);
  EXPECT_FALSE(looks_blank(ink));
  // Axes, tick labels, the title and the legend text are near black.
  EXPECT_GT(ink.dark, 2000) << "non-white " << ink.non_background;
  // The three series colours, solid in the middle of their 2-unit strokes and legend samples.
  EXPECT_GT(count_near(image, 0x1f, 0x77, 0xb4, 40), 200) << "train loss blue";
  EXPECT_GT(count_near(image, 0xbf, 0x00, 0xbf, 40), 100) << "train acc magenta";
  EXPECT_GT(count_near(image, 0x00, 0x80, 0x00, 40), 100) << "test acc green";
  EXPECT_GE(ink.distinct_colours, 4);
}

TEST(PlotChromium, AllWhiteSvgIsJudgedBlank) {
  // The negative control: the same browser and checker must call an empty page blank, so the
  // test above can fail.
  TempDir dir;
  const std::string white =
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"760\" height=\"480\" "
      "viewBox=\"0 0 760 480\"><rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/></svg>\n";
  testing::RgbImage image;
  try {
    image = screenshot(dir, "white", white, 760, 480);
  } catch (const std::exception& error) {
    FAIL() << error.what();
  }
  const testing::InkSummary ink = measure_ink(image);
  EXPECT_TRUE(looks_blank(ink)) << ink.non_background << " non-white pixels";
  EXPECT_EQ(ink.dark, 0);
  EXPECT_EQ(ink.distinct_colours, 0);
}

#endif  // DPTRAIN_PLOT_RENDER_TEST

}  // namespace
}  // namespace dptrain
