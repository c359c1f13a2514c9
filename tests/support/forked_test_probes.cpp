// Probes for tests/support/check_forked_tests.py: what a test sees of its process and how it
// ends, run alone or forked from the test server. Not CTest tests of their own (TEST_FILTER in
// tests/CMakeLists.txt leaves them out); the checker runs them both ways and compares.
#include <dirent.h>
#include <gtest/gtest.h>
#include <limits.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

#include "support/forked_test_server.h"

namespace {

std::string disposition(int signal_number) {
  struct sigaction action {};
  sigaction(signal_number, nullptr, &action);
  if (action.sa_handler == SIG_DFL) return "default";
  if (action.sa_handler == SIG_IGN) return "ignored";
  return "handled";
}

// Descriptors open here, beside the one the listing itself uses.
std::string open_descriptors() {
  std::string result;
  DIR* directory = opendir("/proc/self/fd");
  if (directory == nullptr) return "?";
  const int own = dirfd(directory);
  for (dirent* entry = readdir(directory); entry; entry = readdir(directory)) {
    if (entry->d_name[0] == '.' || std::atoi(entry->d_name) == own) continue;
    result += std::string(result.empty() ? "" : ",") + entry->d_name;
  }
  closedir(directory);
  return result;
}

}  // namespace

// Lines the checker parses, one field each: the pid tells served (another process than the client)
// from run in place; the rest must be the same either way.
TEST(ForkedTestProbe, ReportsItsProcess) {
  char cwd[PATH_MAX] = "?";
  ASSERT_NE(getcwd(cwd, sizeof(cwd)), nullptr);
  const mode_t mask = umask(0);
  umask(mask);
  const char* probe = std::getenv("DPTRAIN_PROBE");
  std::printf(
      "probe: pid=%d\nprobe: cwd=%s\nprobe: umask=%03o\nprobe: threads=%d\n"
      "probe: fds=%s\nprobe: sigterm=%s\nprobe: sigchld=%s\nprobe: sigpipe=%s\n"
      "probe: probe=%s\n",
      static_cast<int>(getpid()), cwd, static_cast<unsigned>(mask),
      dptrain::testing::current_thread_count(), open_descriptors().c_str(),
      disposition(SIGTERM).c_str(), disposition(SIGCHLD).c_str(), disposition(SIGPIPE).c_str(),
      probe ? probe : "(unset)");
}

TEST(ForkedTestProbe, FailsAnExpectation) { EXPECT_EQ(1, 2) << "the planted failure"; }

TEST(ForkedTestProbe, ExitsWithSeven) { std::exit(7); }

TEST(ForkedTestProbe, Aborts) { std::abort(); }

// Starts a child in a process group of its own (as tests/support's run_command does), writes
// both pids to $DPTRAIN_PROBE_PID_FILE, then waits to be killed (two minutes at most).
TEST(ForkedTestProbe, WaitsToBeKilled) {
  const char* pid_file = std::getenv("DPTRAIN_PROBE_PID_FILE");
  ASSERT_NE(pid_file, nullptr);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    setpgid(0, 0);
    sleep(120);
    _exit(0);
  }
  {
    std::ofstream out(std::string(pid_file) + ".part");
    out << getpid() << " " << child << "\n";
  }
  ASSERT_EQ(std::rename((std::string(pid_file) + ".part").c_str(), pid_file), 0);
  std::this_thread::sleep_for(std::chrono::minutes(2));
}
