// The stop-request signals (app/signals.h): which signals are stop requests, and that one of them
// sets the flag instead of ending the process. Not here: the binary's answer to a stop (the
// checkpoint, the line, the status: tests/integration/test_hostile_lifecycle.cpp).
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <vector>

#include "signals.h"

namespace dptrain {
namespace {

bool has(const std::vector<int>& signals, int signal_number) {
  return std::find(signals.begin(), signals.end(), signal_number) != signals.end();
}

// Slurm's --signal (SIGUSR1), SIGUSR2, SIGALRM, SIGVTALRM, SIGXCPU and SIGPWR would end a
// training with no line and no checkpoint. Every signal whose default ends the process is a stop
// request, but for the faults, the uncatchable ones, and the write failures SIGPIPE and SIGXFSZ.
TEST(StopSignals, EverySignalThatWouldEndTheProcessButTheFaultsIsAStopRequest) {
  const auto signals = stop_request_signals();
  for (const int expected : {SIGUSR1, SIGUSR2, SIGALRM, SIGVTALRM, SIGXCPU, SIGPWR, SIGPROF, SIGIO,
                             SIGRTMIN, SIGRTMAX}) {
    EXPECT_TRUE(has(signals, expected)) << "signal " << expected;
  }
  for (const int excluded : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGABRT, SIGSYS, SIGKILL,
                             SIGSTOP, SIGPIPE, SIGXFSZ, SIGCHLD, SIGWINCH, SIGURG, SIGCONT}) {
    EXPECT_FALSE(has(signals, excluded)) << "signal " << excluded;
  }
}

// SIGUSR1 reaches the handler (the flag holds it) where the process would have ended; a signal
// some other part of the process already ignores (SIGUSR2 here) keeps its disposition. Run in a
// child, so that the handlers stay out of the test process.
TEST(StopSignalsDeathTest, SigusrOneSetsTheStopFlagAndAnIgnoredSignalStaysIgnored) {
  EXPECT_EXIT(
      {
        ::signal(SIGUSR2, SIG_IGN);
        const auto& stop = install_stop_handlers(/*announce=*/false);
        ::raise(SIGUSR2);
        if (stop.load() != 0) ::_exit(2);
        ::raise(SIGUSR1);
        ::_exit(stop.load() == SIGUSR1 ? 0 : 3);
      },
      ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace dptrain
