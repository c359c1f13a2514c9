// SIGINT and SIGTERM as stop requests: the first one asks the training to finish its step,
// write a checkpoint and exit with 128 + the signal; a second SIGINT exits at once.
// Not here: how the ranks agree on the stop (train.cpp).
#pragma once

#include <atomic>

namespace dptrain {

// Installs the handlers (once) and returns the flag they set: 0, or the first signal's number.
const std::atomic<int>& install_stop_handlers();

}  // namespace dptrain
