// Drawing the training figure as SVG text and writing it atomically. See plot.h.
// The SVG is built by hand as a string: no graphics library, no fonts measured, so text widths
// are estimates and the layout leaves room for them. Files go through POSIX calls (fsync, rename).
#include "dptrain/report/plot.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "dptrain/core/errors.h"
#include "dptrain/core/files.h"
#include "dptrain/core/devices.h"
#include "dptrain/report/metrics.h"

namespace dptrain {

namespace {

// A series as d2l's Animator draws it: fmts ('-', 'm--', 'g-.') over matplotlib's default blue.
struct Series {
  const char* label;
  const char* colour;
  const char* dasharray;  // "" = solid
  double EpochRecord::*value;
};
const Series kSeries[] = {
    {"train loss", "#1f77b4", "", &EpochRecord::train_loss},
    {"train acc", "#bf00bf", "7,4", &EpochRecord::train_acc},
    {"test acc", "#008000", "9,3,2,3", &EpochRecord::test_acc},
};

// Layout in SVG units. The legend sits right of the panel so it never covers a line.
constexpr double kMarginLeft = 64;    // y tick labels and the y axis label
constexpr double kMarginTop = 44;     // the title
constexpr double kMarginBottom = 56;  // x tick labels and the x axis label
constexpr double kLegendWidth = 124;  // the legend column, right of the panel
constexpr int kMinWidth = 320, kMinHeight = 200;
// Values beyond this are drawn at it: keeps the axis arithmetic finite.
constexpr double kLargestValue = 1e300;

// ============================================================================================
// Text

// `text` made safe inside an XML element or attribute: markup characters escaped, control
// characters XML forbids turned into spaces, bytes that are not UTF-8 turned into '?'.
std::string xml_escape(const std::string& text) {
  std::string out;
  for (size_t i = 0; i < text.size();) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c < 0x80) {
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
          out += (c < 0x20 && c != '\t' && c != '\n' && c != '\r') ? ' ' : static_cast<char>(c);
      }
      ++i;
      continue;
    }
    // A UTF-8 sequence: a lead byte then 1-3 continuation bytes, or else one '?'.
    const size_t length = (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
    bool valid = length > 0 && i + length <= text.size();
    for (size_t k = 1; valid && k < length; ++k) {
      valid = (static_cast<unsigned char>(text[i + k]) & 0xc0) == 0x80;
    }
    if (valid) {
      out.append(text, i, length);
      i += length;
    } else {
      out += '?';
      ++i;
    }
  }
  return out;
}

std::string fixed(double value) {
  char text[64];
  std::snprintf(text, sizeof text, "%.2f", value);
  return text;
}

// ============================================================================================
// Axes

struct Axis {
  double lo = 0, hi = 1;  // the data range the axis spans
  double step = 0.2;      // between ticks
  std::vector<double> ticks;
};

// A round step (1, 2 or 5 times a power of ten) that cuts `span` into about `target` pieces.
double nice_step(double span, int target) {
  const double raw = span / target;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  const double normalised = raw / magnitude;
  const double nice = normalised <= 1 ? 1 : normalised <= 2 ? 2 : normalised <= 5 ? 5 : 10;
  return nice * magnitude;
}

// The y axis: [lo, hi] widened to whole steps, a tick at each.
Axis value_axis(double lo, double hi) {
  Axis axis;
  axis.step = nice_step(hi - lo, 5);
  axis.lo = std::floor(lo / axis.step) * axis.step;
  axis.hi = std::ceil(hi / axis.step) * axis.step;
  if (!std::isfinite(axis.lo)) axis.lo = lo;
  if (!std::isfinite(axis.hi)) axis.hi = hi;
  for (int k = 0; k <= 100; ++k) {
    const double tick = axis.lo + k * axis.step;
    if (tick > axis.hi + axis.step * 1e-9) break;
    axis.ticks.push_back(tick);
  }
  return axis;
}

// The epoch axis: exactly [first, last] as the book's xlim, ticks on round whole epochs; half an
// epoch either side when there is a single one.
Axis epoch_axis(int64_t first, int64_t last) {
  Axis axis;
  axis.lo = static_cast<double>(first);
  axis.hi = static_cast<double>(last);
  if (last <= first) axis.lo -= 0.5, axis.hi = axis.lo + 1;
  axis.step = std::max(1.0, nice_step(axis.hi - axis.lo, 8));
  for (double tick = std::ceil(axis.lo / axis.step) * axis.step;
       tick <= axis.hi + 1e-9 && axis.ticks.size() <= 100; tick += axis.step) {
    axis.ticks.push_back(tick);
  }
  return axis;
}

// A tick label with as many decimals as the step needs: "0.2", "0.05", "1500", "2e+06".
std::string tick_label(double value, double step) {
  if (std::fabs(value) < step * 1e-6) value = 0;  // no "-0" or "1.4e-17" at the origin
  char text[64];
  if (std::fabs(value) >= 1e6 || step < 1e-4) {
    std::snprintf(text, sizeof text, "%.6g", value);
  } else {
    const int decimals = step >= 1 ? 0 : static_cast<int>(std::ceil(-std::log10(step) - 1e-9));
    std::snprintf(text, sizeof text, "%.*f", decimals, value);
  }
  return text;
}

// ============================================================================================
// The figure

// Maps data to SVG coordinates inside the panel.
struct Frame {
  double left, top, right, bottom;
  Axis x, y;
  double px(double epoch) const { return left + (epoch - x.lo) / (x.hi - x.lo) * (right - left); }
  double py(double value) const {
    const double v = std::clamp(value, -kLargestValue, kLargestValue);
    // Clamped so that a point far off the axis still prints as a short number; clipped anyway.
    return std::clamp(bottom - (v - y.lo) / (y.hi - y.lo) * (bottom - top), -1e5, 1e5);
  }
};

std::string text_element(double x, double y, const std::string& anchor, const std::string& text,
                         const std::string& extra = "") {
  return "<text x=\"" + fixed(x) + "\" y=\"" + fixed(y) + "\" text-anchor=\"" + anchor + "\"" +
         extra + ">" + xml_escape(text) + "</text>\n";
}

std::string line_element(double x1, double y1, double x2, double y2) {
  return "<line x1=\"" + fixed(x1) + "\" y1=\"" + fixed(y1) + "\" x2=\"" + fixed(x2) + "\" y2=\"" +
         fixed(y2) + "\"/>\n";
}

std::string stroke_style(const Series& series) {
  std::string style = " fill=\"none\" stroke=\"" + std::string(series.colour) +
                      "\" stroke-width=\"2\" stroke-linejoin=\"round\" stroke-linecap=\"round\"";
  if (*series.dasharray) style += " stroke-dasharray=\"" + std::string(series.dasharray) + "\"";
  return style;
}

std::string draw_axes(const Frame& f) {
  // The grid, as d2l turns it on. crispEdges puts 1-unit lines on whole pixels instead of
  // smearing them over two rows at half strength.
  std::string svg = "<g stroke=\"#e3e3e3\" stroke-width=\"1\" shape-rendering=\"crispEdges\">\n";
  for (double t : f.x.ticks) svg += line_element(f.px(t), f.top, f.px(t), f.bottom);
  for (double t : f.y.ticks) svg += line_element(f.left, f.py(t), f.right, f.py(t));
  svg +=
      "</g>\n<g stroke=\"#333333\" stroke-width=\"1\" shape-rendering=\"crispEdges\">\n";  // tick
                                                                                           // marks
  for (double t : f.x.ticks) svg += line_element(f.px(t), f.bottom, f.px(t), f.bottom + 5);
  for (double t : f.y.ticks) svg += line_element(f.left - 5, f.py(t), f.left, f.py(t));
  svg +=
      "</g>\n<rect x=\"" + fixed(f.left) + "\" y=\"" + fixed(f.top) + "\" width=\"" +
      fixed(f.right - f.left) + "\" height=\"" + fixed(f.bottom - f.top) +
      "\" fill=\"none\" stroke=\"#333333\" stroke-width=\"1\" shape-rendering=\"crispEdges\"/>\n";
  svg += "<g font-size=\"12\" fill=\"#222222\">\n";
  for (double t : f.x.ticks) {
    svg += text_element(f.px(t), f.bottom + 19, "middle", tick_label(t, f.x.step));
  }
  for (double t : f.y.ticks) {
    svg += text_element(f.left - 8, f.py(t) + 4, "end", tick_label(t, f.y.step));
  }
  svg += "</g>\n";
  return svg;
}

// One <path> for the series, broken where a value is missing, and a dot for every point that
// has no finite neighbour to join (so a single epoch still shows).
std::string draw_series(const Frame& f, const Series& series,
                        const std::vector<EpochRecord>& records) {
  std::string d, dots;
  bool pen_down = false;
  for (size_t i = 0; i < records.size(); ++i) {
    const double value = records[i].*series.value;
    if (!std::isfinite(value)) {
      pen_down = false;
      continue;
    }
    const double x = f.px(static_cast<double>(records[i].epoch)), y = f.py(value);
    d += (d.empty() ? "" : " ") + std::string(pen_down ? "L" : "M") + fixed(x) + "," + fixed(y);
    const bool next_finite = i + 1 < records.size() && std::isfinite(records[i + 1].*series.value);
    if (!pen_down && !next_finite) {
      dots += "<circle cx=\"" + fixed(x) + "\" cy=\"" + fixed(y) + "\" r=\"3.5\" fill=\"" +
              series.colour + "\"/>\n";
    }
    pen_down = true;
  }
  return "<path class=\"series\" data-series=\"" + xml_escape(series.label) + "\" d=\"" + d + "\"" +
         stroke_style(series) + "/>\n" + dots;
}

std::string draw_legend(double x, double y) {
  std::string svg = "<g class=\"legend\" font-size=\"13\" fill=\"#222222\">\n";
  for (const Series& series : kSeries) {
    svg += "<path d=\"M" + fixed(x) + "," + fixed(y) + " L" + fixed(x + 30) + "," + fixed(y) +
           "\"" + stroke_style(series) + "/>\n";
    svg += text_element(x + 38, y + 4.5, "start", series.label);
    y += 22;
  }
  return svg + "</g>\n";
}

}  // namespace

// ============================================================================================
// Public functions

std::string plot_title(double lr, int64_t batch_size, const std::vector<std::string>& devices) {
  char text[128];
  std::snprintf(text, sizeof text, "dptrain: ResNet-18 on Fashion-MNIST, lr %g, batch %lld, ", lr,
                static_cast<long long>(batch_size));
  return text + device_list_name(devices);
}

std::string render_training_plot(const std::vector<EpochRecord>& records,
                                 const PlotOptions& options) {
  if (options.width < kMinWidth || options.height < kMinHeight) {
    throw UsageError("plot size " + std::to_string(options.width) + "x" +
                     std::to_string(options.height) + " is too small; at least " +
                     std::to_string(kMinWidth) + "x" + std::to_string(kMinHeight));
  }
  // By epoch, the last record of a repeated epoch winning.
  std::map<int64_t, EpochRecord> by_epoch;
  for (const EpochRecord& record : records) by_epoch[record.epoch] = record;
  std::vector<EpochRecord> sorted;
  for (const auto& [epoch, record] : by_epoch) sorted.push_back(record);

  int64_t first = 1, last = std::max<int64_t>(options.epochs, 1);
  double lo = 0, hi = 1;  // accuracies live in [0, 1]: always shown whole, as in the book
  for (const EpochRecord& record : sorted) {
    first = std::min(first, record.epoch);
    last = std::max(last, record.epoch);
    for (const Series& series : kSeries) {
      const double value = record.*series.value;
      if (!std::isfinite(value)) continue;
      lo = std::min(lo, std::max(value, -kLargestValue));
      hi = std::max(hi, std::min(value, kLargestValue));
    }
  }

  const double width = options.width, height = options.height;
  Frame f{kMarginLeft,
          kMarginTop,
          width - kLegendWidth,
          height - kMarginBottom,
          epoch_axis(first, last),
          value_axis(lo, hi)};

  std::string svg = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" +
                    std::to_string(options.width) + "\" height=\"" +
                    std::to_string(options.height) + "\" viewBox=\"0 0 " +
                    std::to_string(options.width) + " " + std::to_string(options.height) +
                    "\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\">\n";
  svg += "<title>" + xml_escape(options.title) + "</title>\n";
  svg += "<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n";
  // The clip reaches a little past the frame, so a line or dot on the edge shows whole.
  constexpr double kClipMargin = 4;
  svg += "<defs><clipPath id=\"panel\"><rect x=\"" + fixed(f.left - kClipMargin) + "\" y=\"" +
         fixed(f.top - kClipMargin) + "\" width=\"" + fixed(f.right - f.left + 2 * kClipMargin) +
         "\" height=\"" + fixed(f.bottom - f.top + 2 * kClipMargin) + "\"/></clipPath></defs>\n";
  svg += text_element(width / 2, 26, "middle", options.title,
                      " class=\"title\" font-size=\"15\" fill=\"#111111\"");
  svg += draw_axes(f);
  svg += text_element((f.left + f.right) / 2, height - 14, "middle", "epoch",
                      " font-size=\"13\" fill=\"#222222\"");
  svg += text_element(18, (f.top + f.bottom) / 2, "middle", "loss / accuracy",
                      " font-size=\"13\" fill=\"#222222\" transform=\"rotate(-90 18 " +
                          fixed((f.top + f.bottom) / 2) + ")\"");
  svg += "<g clip-path=\"url(#panel)\">\n";
  for (const Series& series : kSeries) svg += draw_series(f, series, sorted);
  svg += "</g>\n";
  svg += draw_legend(f.right + 16, f.top + 14);
  return svg + "</svg>\n";
}

void check_plot_path(const std::string& path) {
  const size_t slash = path.rfind('/');
  std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  for (char& c : name) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  if (name.size() <= 4 || name.compare(name.size() - 4, 4, ".svg") != 0) {
    throw UsageError("--plot " + path + ": the file name must end in .svg (the plot is SVG)");
  }
}

void write_plot_atomically(const std::string& path, const std::string& svg) {
  check_plot_path(path);
  write_file_atomically(path, svg.data(), svg.size(), "plot " + path);
}

}  // namespace dptrain
