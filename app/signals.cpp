// The stop-request signal handlers. See signals.h.
#include "signals.h"

#include <signal.h>
#include <unistd.h>

#include <cstring>

namespace dptrain {
namespace {

std::atomic<int> g_stop_signal{0};
static_assert(std::atomic<int>::is_always_lock_free,
              "the handler may only touch lock-free atomics");

// Only async-signal-safe calls in here: an atomic exchange, write(2) and _exit(2).
void on_stop_signal(int signal_number) {
  const int previous = g_stop_signal.exchange(signal_number);
  if (previous != 0 && signal_number == SIGINT) {
    constexpr char kMessage[] = "\ndptrain: second interrupt, exiting now\n";
    (void)!::write(STDERR_FILENO, kMessage, sizeof kMessage - 1);
    ::_exit(128 + SIGINT);
  }
  if (previous != 0) g_stop_signal.store(previous);  // keep the first request's signal
  constexpr char kMessage[] =
      "\ndptrain: stopping after this step (writing a checkpoint if --checkpoint-dir is set); "
      "interrupt again to exit at once\n";
  (void)!::write(STDERR_FILENO, kMessage, sizeof kMessage - 1);
}

}  // namespace

const std::atomic<int>& install_stop_handlers() {
  struct sigaction action;
  std::memset(&action, 0, sizeof action);
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // blocking reads and writes carry on; the step loop polls
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
  return g_stop_signal;
}

}  // namespace dptrain
