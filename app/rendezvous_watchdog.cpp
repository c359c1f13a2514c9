// The rendezvous watchdog. See rendezvous_watchdog.h.
#include "rendezvous_watchdog.h"

#include <unistd.h>

#include <cstdio>
#include <utility>

namespace dptrain {

RendezvousWatchdog::RendezvousWatchdog(std::chrono::milliseconds deadline, std::string message) {
  thread_ = std::thread([this, deadline, message = std::move(message)] {
    std::unique_lock<std::mutex> lock(mutex_);
    if (cancelled_.wait_for(lock, deadline, [this] { return done_; })) return;
    // The rendezvous is stuck in a call nothing can interrupt; leaving is the only way out.
    std::fprintf(stderr, "error: %s\n", message.c_str());
    std::fflush(stderr);
    ::_exit(1);
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
