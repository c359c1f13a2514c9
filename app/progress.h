// Where progress goes: a live bar redrawn on stderr when it is a terminal, plain lines every
// --log-every steps when it is not (CI, pipes, log files), nothing with --quiet.
// Not here: the formatting itself (report.h).
#pragma once

#include <cstdint>
#include <string>

#include "dptrain/train/epoch_stats.h"

namespace dptrain {

class ProgressPrinter {
 public:
  // `terminal`: stderr is a terminal; `log_every`: steps between lines otherwise.
  ProgressPrinter(bool terminal, bool quiet, int64_t log_every, std::string prefix);

  // How often the training should call show(): every few steps for the bar, every
  // --log-every steps for lines, never when quiet.
  int64_t steps_between_updates() const;
  void show(const ProgressStats& progress);
  // Before a line goes to stdout: clears the bar so that the line is not mixed into it.
  void clear();

 private:
  bool terminal_;
  bool quiet_;
  int64_t log_every_;
  std::string prefix_;
  bool bar_drawn_ = false;
};

}  // namespace dptrain
