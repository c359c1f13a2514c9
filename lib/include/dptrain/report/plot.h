// The book's training figure as a standalone SVG (the --plot flag): train loss, train accuracy
// and test accuracy against the epoch, in one panel as d2l's Animator draws them, and writing it
// so that a reader never sees half a file. Not here: the per-epoch records (metrics.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dptrain/report/metrics.h"

namespace dptrain {

struct PlotOptions {
  // The line above the plot, e.g. from plot_title(); plain text, escaped for XML when drawn.
  std::string title;
  int width = 760;  // SVG user units, which a browser draws as CSS pixels
  int height = 480;
  // The x axis runs from 1 to this, so a plot of a run still going shows where it will end;
  // 0 = to the last record's epoch.
  int64_t epochs = 0;
};

// "dptrain: ResNet-18 on Fashion-MNIST, lr 0.1, batch 256, [cuda:0, cuda:1]"
std::string plot_title(double lr, int64_t batch_size, const std::vector<std::string>& devices);

// The figure for `records`, as d2l draws it: one panel, x = epoch, y = value, the three series
// "train loss" (solid blue #1f77b4), "train acc" (dashed magenta #bf00bf) and "test acc"
// (dash-dot green #008000), with axis ticks at round values, axis labels, a legend to the right of
// the panel and the title on top. One panel rather than two keeps the book's look; the y axis
// spans 0..1 widened to every finite value, so a large loss squeezes the accuracy lines but hides
// nothing. Records are sorted by epoch (the last one wins for a repeated epoch, as after a
// resumed run); non-finite values are left out, the line broken there; a point with no
// neighbour to join (a single epoch) is drawn as a dot. Every series is one <path> element.
std::string render_training_plot(const std::vector<EpochRecord>& records,
                                 const PlotOptions& options);

// Throws UsageError naming --plot unless `path` ends in ".svg" (any case). Call it before
// training.
void check_plot_path(const std::string& path);

// Writes `svg` to `<path>.tmp`, syncs it and renames it over `path`, so `path` always holds a
// whole figure. Throws UsageError from check_plot_path, DataError naming the path and the reason
// when writing fails (the temporary file is removed then).
void write_plot_atomically(const std::string& path, const std::string& svg);

}  // namespace dptrain
