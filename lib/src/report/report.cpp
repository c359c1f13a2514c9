// Formatting of the per-epoch and final lines. See report.h.
#include "dptrain/report/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "dptrain/core/devices.h"
#include "dptrain/core/statistics.h"
#include "dptrain/train/epoch_stats.h"

namespace dptrain {

namespace {

// "1.3 GiB" from 1 GiB up, else "412 MiB".
std::string format_bytes(double bytes) {
  char text[32];
  constexpr double kMiB = 1024.0 * 1024.0;
  if (bytes >= 1024.0 * kMiB) {
    std::snprintf(text, sizeof text, "%.1f GiB", bytes / (1024.0 * kMiB));
  } else {
    std::snprintf(text, sizeof text, "%.0f MiB", bytes / kMiB);
  }
  return text;
}

// ", 0.412 TFLOP/s (MFU 32%), GPU peak 12.1 GiB": each part where its figure is known (a
// resumed run's earlier epochs have none); the GPU's memory on CUDA, the process's elsewhere.
std::string format_efficiency(const EpochStats& stats) {
  std::string text;
  char part[64];
  if (std::isfinite(stats.tflops)) {
    std::snprintf(part, sizeof part, ", %.3g TFLOP/s", stats.tflops);
    text += part;
    if (std::isfinite(stats.mfu)) {
      const double percent = 100.0 * stats.mfu;
      std::snprintf(part, sizeof part, percent >= 10 ? " (MFU %.0f%%)" : " (MFU %.2g%%)", percent);
      text += part;
    }
  }
  if (std::isfinite(stats.peak_device_bytes)) {
    text += ", GPU peak " + format_bytes(stats.peak_device_bytes);
  } else if (std::isfinite(stats.peak_host_bytes)) {
    text += ", peak RSS " + format_bytes(stats.peak_host_bytes);
  }
  return text;
}

// `value` with `format`, or "-" where there is no figure (NaN: an epoch without a trained step).
std::string figure(const char* format, double value) {
  if (std::isnan(value)) return "-";
  char text[64];
  std::snprintf(text, sizeof text, format, value);
  return text;
}

// After the training figures: " (7 of 8 steps skipped, non-finite)", whose means they are
// over, or " (no step trained: all 8 steps skipped, non-finite)" where there are none (Note [An
// epoch without a trained step] in train/rank.cpp); "" when every step trained.
std::string format_skipped(const EpochStats& stats) {
  const std::string steps = std::to_string(stats.steps);
  if (std::isnan(stats.train_loss) && stats.steps > 0) {
    return " (no step trained: all " + steps + " steps skipped, non-finite)";
  }
  if (stats.skipped_steps <= 0) return "";
  return " (" + std::to_string(stats.skipped_steps) + " of " + steps +
         " steps skipped, non-finite)";
}

// After the test accuracy: ", val acc 0.9123" where the run holds out a validation set
// (--val-split), else "".
std::string format_validation(const EpochStats& stats) {
  return std::isnan(stats.val_acc) ? "" : ", val acc " + figure("%.4f", stats.val_acc);
}

}  // namespace

std::string format_epoch_line(const EpochStats& stats) {
  char head[64];
  std::snprintf(head, sizeof head, "epoch %lld/%lld: ", static_cast<long long>(stats.epoch),
                static_cast<long long>(stats.epochs));
  return std::string(head) + "train loss " + figure("%.4f", stats.train_loss) + ", train acc " +
         figure("%.4f", stats.train_acc) + format_skipped(stats) + ", test acc " +
         figure("%.4f", stats.test_acc) + format_validation(stats) + ", " +
         figure("%.1f", stats.seconds) + " s, " + figure("%.0f", stats.images_per_second) +
         " img/s" + format_efficiency(stats);
}

std::string format_final_line(const TrainResult& result) {
  double test_acc = 0, seconds = 0;
  if (!result.epochs.empty()) {
    test_acc = result.epochs.back().test_acc;
    for (const auto& epoch : result.epochs) seconds += epoch.seconds;
    seconds /= static_cast<double>(result.epochs.size());
  }
  char line[128];
  std::snprintf(line, sizeof line, "test acc: %.2f, %.1f sec/epoch on ", test_acc, seconds);
  std::string timer;
  if (result.gpu_samples > 0) {  // a timed GPU run: what the step timer could not measure
    timer = "; GPU timer: " + std::to_string(result.gpu_samples_dropped) + " of " +
            std::to_string(result.gpu_samples) + " samples dropped";
  }
  return line + device_list_name(result.devices) + timer;
}

std::string format_graph_line(const TrainResult& result) {
  if (result.graph_nodes < 0) return "";
  return "CUDA graph: one step is " + std::to_string(result.graph_nodes) +
         " nodes (kernels, copies, memsets: the launches one replay stands for), replayed " +
         std::to_string(result.graph_replays) + " times";
}

std::optional<double> steady_epoch_seconds(const std::vector<double>& seconds) {
  if (seconds.size() < 2) return std::nullopt;
  return median_or_nan(std::vector<double>(seconds.begin() + 1, seconds.end()));
}

std::string format_steady_line(const TrainResult& result) {
  std::vector<double> seconds;
  for (const auto& epoch : result.epochs) seconds.push_back(epoch.seconds);
  const auto steady = steady_epoch_seconds(seconds);
  if (!steady) return "";
  const auto last = static_cast<long long>(result.epochs.back().epoch);
  char line[200];
  std::snprintf(line, sizeof line,
                "median of epochs 2-%lld: %.3g sec/epoch (epoch 1: %.3g s); the book's line "
                "below is the mean of epochs 1-%lld",
                last, *steady, result.epochs.front().seconds, last);
  return line;
}

std::string format_step_time_line(const TrainResult& result) {
  if (result.gpu_step_ms.empty() || result.epochs.empty()) return "";
  const double gpu_ms = median_or_nan(result.gpu_step_ms);
  // The wall pace per step of the steady epochs (the first's alone when there is one).
  const size_t first = result.epochs.size() > 1 ? 1 : 0;
  std::vector<double> wall;
  for (size_t i = first; i < result.epochs.size(); ++i) {
    if (result.epochs[i].steps > 0) wall.push_back(wall_ms_per_step(result.epochs[i]));
  }
  if (wall.empty()) return "";
  const double wall_ms = median_or_nan(wall);
  const double share = wall_ms > 0 ? gpu_ms / wall_ms : 0;
  char verdict[96];
  if (share >= 0.9) {
    std::snprintf(verdict, sizeof verdict, "GPU-bound (the GPU works %.0f%% of the wall time)",
                  100 * share);
  } else {
    std::snprintf(verdict, sizeof verdict, "%s, the wall is %.2fx the GPU time",
                  share < 0.6 ? "host-bound" : "partly host-bound",
                  gpu_ms > 0 ? wall_ms / gpu_ms : 0);
  }
  const std::string epochs =
      first == 0 ? "epoch 1" : "epochs 2-" + std::to_string(result.epochs.back().epoch);
  char line[320];
  std::snprintf(line, sizeof line,
                "GPU time per step: median %.3g ms of %zu timed step%s (CUDA events); wall time "
                "per step: median %.3g ms (%s): %s",
                gpu_ms, result.gpu_step_ms.size(), result.gpu_step_ms.size() == 1 ? "" : "s",
                wall_ms, epochs.c_str(), verdict);
  return line;
}

namespace {

double images_per_second(const ProgressStats& p) {
  return p.seconds > 0 ? p.images / p.seconds : 0;
}

// Seconds left in the epoch at the pace so far.
double seconds_left(const ProgressStats& p) {
  if (p.step <= 0 || p.steps_in_epoch <= p.step) return 0;
  return p.seconds / static_cast<double>(p.step) * static_cast<double>(p.steps_in_epoch - p.step);
}

}  // namespace

std::string format_progress_bar(const ProgressStats& p, int bar_width) {
  const double fraction = p.steps_in_epoch > 0
                              ? static_cast<double>(p.step) / static_cast<double>(p.steps_in_epoch)
                              : 0;
  const int filled = std::max(0, std::min(bar_width, static_cast<int>(fraction * bar_width)));
  const auto left = static_cast<long long>(seconds_left(p) + 0.5);
  char tail[160];
  std::snprintf(tail, sizeof tail, "] %lld/%lld  %.0f img/s  loss %.4f  acc %.4f  ETA %lld:%02lld",
                static_cast<long long>(p.step), static_cast<long long>(p.steps_in_epoch),
                images_per_second(p), p.running_loss, p.running_acc, left / 60, left % 60);
  return "epoch " + std::to_string(p.epoch) + "/" + std::to_string(p.epochs) + " [" +
         std::string(static_cast<size_t>(filled), '#') +
         std::string(static_cast<size_t>(bar_width - filled), '.') + tail;
}

std::string format_progress_line(const ProgressStats& p) {
  char line[200];
  std::snprintf(line, sizeof line,
                "epoch %lld/%lld step %lld/%lld: loss %.4f, acc %.4f, %.0f img/s, %.0f s left",
                static_cast<long long>(p.epoch), static_cast<long long>(p.epochs),
                static_cast<long long>(p.step), static_cast<long long>(p.steps_in_epoch),
                p.running_loss, p.running_acc, images_per_second(p), seconds_left(p));
  return line;
}

std::string format_eval_line(const EvalResult& result) {
  // A loss that overflowed is "nan" whatever its sign bit (printf writes "-nan" for some NaNs).
  const std::string loss =
      std::isnan(result.test_loss) ? "nan" : figure("%.4f", result.test_loss);
  char line[160];
  std::snprintf(line, sizeof line, "test acc: %.4f, test loss %s (%lld images) on ",
                result.test_acc, loss.c_str(), static_cast<long long>(result.examples));
  return line + device_list_name(result.devices);
}

}  // namespace dptrain
