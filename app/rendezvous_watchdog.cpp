// The rendezvous watchdog. See rendezvous_watchdog.h.
#include "rendezvous_watchdog.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "dptrain/core/files.h"

namespace dptrain {

RendezvousWatchdog::RendezvousWatchdog(std::optional<std::chrono::milliseconds> deadline,
                                       std::string message, const std::atomic<int>& stop_signal) {
  thread_ = std::thread([this, deadline, message = std::move(message), &stop_signal] {
    using Clock = std::chrono::steady_clock;
    const auto until = deadline ? Clock::now() + *deadline : Clock::time_point::max();
    std::unique_lock<std::mutex> lock(mutex_);
    while (!done_) {
      // SIGPIPE stands for a failed standard output (CheckedStdout in main.cpp), whose rule is
      // to train a step and keep a checkpoint: the training loop answers that one.
      if (const int signal_number = stop_signal.load();
          signal_number != 0 && signal_number != SIGPIPE) {
        std::fprintf(stderr, "dptrain: stopped by signal %d before the first step; nothing to save\n",
                     signal_number);
        std::fflush(stderr);
        ::_exit(128 + signal_number);
      }
      if (Clock::now() >= until) {
        // The rendezvous is stuck in a call nothing can interrupt; leaving is the only way out.
        std::fprintf(stderr, "error: %s\n", message_line(message).c_str());
        std::fflush(stderr);
        ::_exit(1);
      }
      cancelled_.wait_for(lock, std::chrono::milliseconds(100));
    }
  });
}

RendezvousWatchdog::~RendezvousWatchdog() { cancel(); }

void RendezvousWatchdog::cancel() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    done_ = true;
  }
  cancelled_.notify_all();
  if (thread_.joinable()) thread_.join();
}

}  // namespace dptrain
