// Stop requests: SIGINT and SIGTERM, and a standard output that can no longer be written (a
// closed pipe, a full disk). The first request asks the training to finish its step, write a
// checkpoint and exit; a second SIGINT exits at once. SIGPIPE is ignored, so that a closed pipe
// is a failed write that the program sees, not a death without a checkpoint.
// Not here: how the ranks agree on the stop (train.cpp).
#pragma once

#include <atomic>
#include <cstdio>
#include <string>

namespace dptrain {

// Installs the handlers (once) and returns the flag they set: 0, or the first request's signal
// number. `announce`: write a line to stderr on the first signal saying what happens next
// (train); without it the caller reports the stop itself (download).
const std::atomic<int>& install_stop_handlers(bool announce = true);

// Ignores SIGPIPE for the whole process: writes to a closed pipe then fail with EPIPE.
void ignore_broken_pipes();

// Requests a stop as a signal would (the first request wins).
void request_stop(int signal_number);

// Writes `text` to `stream` and flushes it; returns 0 or the errno of the failure.
int write_and_flush(std::FILE* stream, const std::string& text);

}  // namespace dptrain
