// Formatting of the per-epoch and final lines. See report.h.
#include "dptrain/report.h"

#include <cstdio>

#include "dptrain/devices.h"

namespace dptrain {

std::string format_epoch_line(const EpochStats& stats) {
  char line[256];
  std::snprintf(line, sizeof line,
                "epoch %lld/%lld: train loss %.4f, train acc %.4f, test acc %.4f, %.1f s, "
                "%.0f img/s",
                static_cast<long long>(stats.epoch), static_cast<long long>(stats.epochs),
                stats.train_loss, stats.train_acc, stats.test_acc, stats.seconds,
                stats.images_per_second);
  return line;
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
  return line + device_list_name(result.devices);
}

}  // namespace dptrain
