// A last resort for a rendezvous that hangs in a blocking socket call: LibTorch's TCPStore
// client waits without end on a listener that accepts but never answers (another program on
// MASTER_PORT). If the world is not up by the deadline, one error line and exit status 1.
// Not here: the ordinary timeouts, which the library reports itself (rendezvous.h).
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

namespace dptrain {

class RendezvousWatchdog {
 public:
  // `message` is printed after "error: " when `deadline` passes before cancel().
  RendezvousWatchdog(std::chrono::milliseconds deadline, std::string message);
  ~RendezvousWatchdog();  // cancels
  RendezvousWatchdog(const RendezvousWatchdog&) = delete;
  RendezvousWatchdog& operator=(const RendezvousWatchdog&) = delete;

  void cancel();

 private:
  std::mutex mutex_;
  std::condition_variable cancelled_;
  bool done_ = false;
  std::thread thread_;
};

}  // namespace dptrain
