// The stop-request signal handlers and checked writes. See signals.h.
#include "signals.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace dptrain {
namespace {

std::atomic<int> g_stop_signal{0};
bool g_stdout_was_closed = false;
std::atomic<bool> g_announce{true};
static_assert(std::atomic<int>::is_always_lock_free && std::atomic<bool>::is_always_lock_free,
              "the handler may only touch lock-free atomics");

// Only async-signal-safe calls in here: atomics, write(2) and _exit(2).
void on_stop_signal(int signal_number) {
  const int previous = g_stop_signal.exchange(signal_number);
  if (previous != 0 && signal_number == SIGINT) {
    constexpr char kMessage[] = "\ndptrain: second interrupt, exiting now\n";
    (void)!::write(STDERR_FILENO, kMessage, sizeof kMessage - 1);
    ::_exit(128 + SIGINT);
  }
  if (previous != 0) g_stop_signal.store(previous);  // keep the first request's signal
  if (!g_announce.load()) return;
  constexpr char kMessage[] =
      "\ndptrain: stopping after this step (writing a checkpoint if --checkpoint-dir is set); "
      "interrupt again to exit at once\n";
  (void)!::write(STDERR_FILENO, kMessage, sizeof kMessage - 1);
}

}  // namespace

std::vector<int> stop_request_signals() {
  std::vector<int> signals{SIGUSR1, SIGUSR2, SIGALRM, SIGVTALRM, SIGPROF, SIGXCPU, SIGIO};
#ifdef SIGPWR
  signals.push_back(SIGPWR);
#endif
#ifdef SIGSTKFLT
  signals.push_back(SIGSTKFLT);
#endif
  // The real-time signals (default action: end the process), SIGRTMIN's own number included;
  // glibc keeps the two below SIGRTMIN for its threads.
  for (int signal_number = SIGRTMIN; signal_number <= SIGRTMAX; ++signal_number) {
    signals.push_back(signal_number);
  }
  return signals;
}

const std::atomic<int>& install_stop_handlers(bool announce) {
  g_announce.store(announce);
  struct sigaction action;
  std::memset(&action, 0, sizeof action);
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // blocking reads and writes carry on; the step loop polls
  // A lost terminal (SIGHUP) and Ctrl-\ (SIGQUIT) are stop requests too: by default either ends
  // the process with no line, no checkpoint and a download's .part left behind.
  for (const int signal_number : {SIGINT, SIGTERM, SIGHUP, SIGQUIT}) {
    sigaction(signal_number, &action, nullptr);
  }
  // Note [Every signal that would end the process is a stop request]
  // Schedulers warn before they kill with other signals than SIGTERM: Slurm's --signal sends
  // SIGUSR1 by default (or any signal named), batch systems send SIGXCPU at a CPU-time limit, a
  // UPS daemon SIGPWR, and a script's `timeout -s` or alarm(2) SIGALRM. Their default action ends
  // the process at once: no line, no checkpoint, a .part left. So every signal whose default
  // action ends the process is a stop request, except the faults a program raises itself
  // (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGABRT, SIGSYS: answering them would run on in a
  // broken state), SIGKILL and SIGSTOP (which cannot be caught), and SIGPIPE and SIGXFSZ, which
  // ignore_write_signals() turns into failed writes. A signal some part of the process already
  // handles or ignores (a profiler's SIGPROF, a library's real-time signal, a SIGUSR1 set to
  // SIG_IGN by whoever started us) keeps its disposition.
  for (const int signal_number : stop_request_signals()) {
    struct sigaction current;
    if (sigaction(signal_number, nullptr, &current) != 0) continue;
    if (current.sa_handler != SIG_DFL || (current.sa_flags & SA_SIGINFO) != 0) continue;
    sigaction(signal_number, &action, nullptr);
  }
  return g_stop_signal;
}

void reserve_standard_descriptors() {
  for (int fd = STDIN_FILENO; fd <= STDERR_FILENO; ++fd) {
    if (::fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
    // open(2) returns the lowest free descriptor, which is `fd`: the lower ones are open.
    const int opened = ::open("/dev/null", fd == STDIN_FILENO ? O_RDONLY : O_WRONLY);
    if (opened >= 0 && opened != fd) {
      ::dup2(opened, fd);
      ::close(opened);
    }
    if (fd == STDOUT_FILENO) g_stdout_was_closed = true;
  }
}

bool standard_output_was_closed() { return g_stdout_was_closed; }

void ignore_write_signals() {
  ::signal(SIGPIPE, SIG_IGN);
  ::signal(SIGXFSZ, SIG_IGN);
}

void request_stop(int signal_number) {
  int expected = 0;
  g_stop_signal.compare_exchange_strong(expected, signal_number);
}

int write_and_flush(std::FILE* stream, const std::string& text) {
  errno = 0;
  const bool wrote = std::fwrite(text.data(), 1, text.size(), stream) == text.size();
  const bool flushed = std::fflush(stream) == 0;
  if (wrote && flushed) return 0;
  const int error = errno != 0 ? errno : EIO;
  std::clearerr(stream);
  return error;
}

}  // namespace dptrain
