// Stop requests: SIGINT, SIGTERM, SIGHUP, SIGQUIT and every other signal whose default action
// would end the process (stop_request_signals), and a standard output that can no longer be
// written (a closed pipe, a full disk). The first request asks the training to finish its step,
// write a checkpoint and exit; a second SIGINT exits at once. SIGPIPE and SIGXFSZ are ignored, so
// that a closed pipe or a full file-size limit is a failed write that the program sees, not a
// death.
// Not here: how the ranks agree on the stop (RankTraining::run in lib/src/train/rank.cpp).
#pragma once

#include <atomic>
#include <cstdio>
#include <string>
#include <vector>

namespace dptrain {

// The signals besides SIGINT, SIGTERM, SIGHUP and SIGQUIT that are stop requests: every one
// whose default action ends the process, less the faults, SIGKILL, SIGPIPE and SIGXFSZ (Note
// [Every signal that would end the process is a stop request] in signals.cpp). Each is answered
// only where its disposition is still the default when the handlers are installed.
std::vector<int> stop_request_signals();

// Installs the handlers (once) and returns the flag they set: 0, or the first request's signal
// number. `announce`: write a line to stderr on the first signal saying what happens next
// (train); without it the caller reports the stop itself (download).
const std::atomic<int>& install_stop_handlers(bool announce = true);

// Ignores SIGPIPE and SIGXFSZ for the whole process: a write to a closed pipe then fails with
// EPIPE, and one past the file-size limit (ulimit -f) with EFBIG, each a failure the writer
// reports, where the signals would end the process with no error line and a temporary file left.
void ignore_write_signals();

// Opens /dev/null on whichever of descriptors 0, 1 and 2 is closed, so that no file dptrain
// opens later becomes standard output or error. Call first thing in main.
void reserve_standard_descriptors();
// Whether descriptor 1 was closed when reserve_standard_descriptors ran: every write to
// standard output then fails (EBADF), as it would have without the /dev/null in its place.
bool standard_output_was_closed();

// Requests a stop as a signal would (the first request wins).
void request_stop(int signal_number);

// Writes `text` to `stream` and flushes it; returns 0 or the errno of the failure.
int write_and_flush(std::FILE* stream, const std::string& text);

}  // namespace dptrain
