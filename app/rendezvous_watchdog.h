// A last resort for the start of a run, before its first step: the data load and the rendezvous
// block in calls that a stop request cannot interrupt (LibTorch's TCPStore client waits without
// end on a listener that accepts but never answers, another program on MASTER_PORT; rank 0
// waits --timeout for its peers). A stop request by a signal (SIGINT, SIGTERM, SIGHUP,
// SIGQUIT) ends the process within 0.1 s with one line and 128 + the signal: nothing has
// trained, so nothing is lost. Past the deadline, one error line and exit status 1.
// Not here: the ordinary timeouts, which the library reports itself (rendezvous.h).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

namespace dptrain {

class RendezvousWatchdog {
 public:
  // `message` is printed after "error: " when `deadline` (none: no deadline) passes before
  // cancel(); `stop_signal` (install_stop_handlers) is polled until then.
  RendezvousWatchdog(std::optional<std::chrono::milliseconds> deadline, std::string message,
                     const std::atomic<int>& stop_signal);
  ~RendezvousWatchdog();  // cancels
  RendezvousWatchdog(const RendezvousWatchdog&) = delete;
  RendezvousWatchdog& operator=(const RendezvousWatchdog&) = delete;

  // The first step is about to run: from here on the training loop answers stop requests.
  void cancel();

 private:
  std::mutex mutex_;
  std::condition_variable cancelled_;
  bool done_ = false;
  std::thread thread_;
};

}  // namespace dptrain
