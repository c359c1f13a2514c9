// The progress bar and progress lines on stderr. See progress.h.
#include "progress.h"

#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>

#include "dptrain/report/report.h"
#include "dptrain/train/epoch_stats.h"

namespace dptrain {
namespace {

constexpr int kBarWidth = 30;             // characters between the brackets
constexpr int64_t kStepsBetweenBars = 5;  // each redraw reads the device, so not every step

}  // namespace

ProgressPrinter::ProgressPrinter(bool terminal, bool quiet, int64_t log_every, std::string prefix)
    : terminal_(terminal), quiet_(quiet), log_every_(log_every), prefix_(std::move(prefix)) {}

int64_t ProgressPrinter::steps_between_updates() const {
  if (quiet_) return 0;
  return terminal_ ? kStepsBetweenBars : log_every_;
}

void ProgressPrinter::show(const ProgressStats& progress) {
  if (quiet_) return;
  if (terminal_) {
    // \r back to the line start, the bar, then erase whatever a longer bar left behind.
    std::fprintf(stderr, "\r%s%s\033[K", prefix_.c_str(),
                 format_progress_bar(progress, kBarWidth).c_str());
    bar_drawn_ = true;
  } else {
    // Lines only on the --log-every beat: the epoch's own line follows its last step anyway.
    if (progress.step % log_every_ != 0) return;
    std::fprintf(stderr, "%s%s\n", prefix_.c_str(), format_progress_line(progress).c_str());
  }
  std::fflush(stderr);
}

void ProgressPrinter::clear() {
  if (!bar_drawn_) return;
  std::fputs("\r\033[K", stderr);
  std::fflush(stderr);
  bar_drawn_ = false;
}

}  // namespace dptrain
