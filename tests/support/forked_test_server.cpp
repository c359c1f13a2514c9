// The forked test server: the test binary, loaded once, forks a fresh child for every test that
// dptrain_test_client hands it; see forked_test_server.h.
// Not here: deciding whether to ask it (the client), gtest's own main (test_main.cpp).
#include "support/forked_test_server.h"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "support/forked_test_protocol.h"
#include "support/forked_test_socket.h"

extern char** environ;

// Note [Tests forked from a loaded binary]
// CTest starts the test binary once per test, and each start costs 0.5 to 1.2 s of CPU before
// the test runs: Debian's LibTorch 1.13 pulls in some 285 shared libraries whose symbols the
// dynamic loader binds, then registers its operators (perf and time, AMD EPYC, 2026-12-03). Over
// ~750 tests that was most of CTest's time in CI (docs/hardening.md, "Time in CI"). So CTest runs
// each test through dptrain_test_client, which hands it to this server: the binary, started once by
// a CTest fixture, forks a child per test that runs gtest with the test's own arguments. The child
// is the process a fresh start would have been at main: the libraries loaded and initialised, one
// thread, no test run yet, the client's descriptors 0-2, working directory, umask and signal
// dispositions as the binary had them when it started. What a fork cannot give back is refused
// rather than approximated:
//  - the environment is read by libraries while they load (libgomp's OMP_*), so a client whose
//    environment differs in any variable from the server's gets kNotServed and starts the
//    binary itself, as CTest would have (but for "_", which shells set to each program's path);
//  - a binary rebuilt since the server loaded it is another binary: kNotServed;
//  - a server that has more than one thread at start (a library that starts threads while it
//    loads) would fork children without them: it does not serve at all.
// Every test still runs in a process of its own, in parallel with CTest -j, under CTest's
// timeout: when CTest kills the client, the client's handler here kills the test and everything
// it started. One thing is left out on purpose: a served test ends with _exit once gtest has
// reported (run_test), skipping LibTorch's teardown at exit. tests/support/check_forked_tests.py
// holds the rest to behaving as a test run alone.

namespace dptrain::testing {
namespace {

using forked::Outcome;
using forked::Reply;
using forked::Request;
using forked::RequestKind;

// What the server knows of itself, taken before it changes anything a test inherits.
struct Server {
  std::string socket_path;
  ino_t socket_inode = 0;
  forked::BinaryIdentity binary;
  std::vector<std::string> environment;  // comparable_environment()
  struct sigaction original_sigchld {};
  struct sigaction original_sigterm {};
};

volatile sig_atomic_t stop_requested = 0;
void request_stop(int) { stop_requested = 1; }

// The shell sets "_" to the path of each program it starts, and nothing reads it while loading:
// it is left out of the comparison, and the forked test gets the client's (run_test).
bool is_underscore(const std::string& entry) { return entry.rfind("_=", 0) == 0; }

// The entries to compare: sorted, without "_".
std::vector<std::string> comparable_environment(std::vector<std::string> entries) {
  entries.erase(std::remove_if(entries.begin(), entries.end(), is_underscore), entries.end());
  std::sort(entries.begin(), entries.end());
  return entries;
}

}  // namespace

int current_thread_count() {
  std::ifstream status("/proc/self/status");
  std::string key;
  while (status >> key) {
    if (key == "Threads:") {
      int threads = 0;
      status >> threads;
      return threads;
    }
  }
  return -1;
}

namespace {

// A descriptor that becomes readable when `pid` ends, or -1 where the kernel has none (< 5.3).
int open_pidfd(pid_t pid) {
#ifdef SYS_pidfd_open
  return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
#else
  (void)pid;
  errno = ENOSYS;
  return -1;
#endif
}

void send_reply(int connection, Outcome outcome, int32_t value) {
  const Reply reply{outcome, value};
  (void)forked::write_all(connection, &reply, sizeof(reply));  // a client gone needs no answer
}

// The request's header with the three descriptors it carries; false on anything malformed.
bool receive_request(int connection, Request& request, int (&fds)[forked::kPassedDescriptors]) {
  return forked::receive_with_descriptors(connection, &request, sizeof(request), fds) &&
         request.magic == forked::kMagic && request.version == forked::kVersion &&
         request.payload_bytes <= forked::kMaxPayloadBytes;
}

// The payload's strings: the working directory, then argc arguments, then envc entries.
bool read_strings(int connection, const Request& request, std::vector<std::string>& strings) {
  std::string payload(request.payload_bytes, '\0');
  if (!forked::read_exactly(connection, payload.data(), payload.size())) return false;
  if (payload.empty() || payload.back() != '\0') return false;
  for (size_t begin = 0; begin < payload.size();) {
    const size_t end = payload.find('\0', begin);
    strings.emplace_back(payload, begin, end - begin);
    begin = end + 1;
  }
  return request.argc >= 1 && strings.size() == 1 + size_t{request.argc} + request.envc;
}

// The forked test: the client's descriptors and working directory, the dispositions the binary
// started with, then gtest as main would run it, and _exit. Never returns.
[[noreturn]] void run_test(const Server& server, int connection,
                           const int (&fds)[forked::kPassedDescriptors],
                           const std::vector<std::string>& strings, uint32_t argc,
                           int (*run_tests)(int, char**)) {
  ::setpgid(0, 0);  // so that the handler can end the test and whatever it started
  for (int target = 0; target < 3; ++target) {
    if (::dup2(fds[target], target) < 0) ::_exit(127);
  }
  for (int fd : fds) {
    if (fd > 2) ::close(fd);
  }
  ::close(connection);
  ::sigaction(SIGCHLD, &server.original_sigchld, nullptr);
  ::sigaction(SIGTERM, &server.original_sigterm, nullptr);
  if (::chdir(strings[0].c_str()) != 0) {
    std::fprintf(stderr, "forked test server: cannot enter %s: %s\n", strings[0].c_str(),
                 std::strerror(errno));
    ::_exit(127);
  }
  const auto first_env = strings.begin() + 1 + argc;
  const auto underscore = std::find_if(first_env, strings.end(), is_underscore);
  if (underscore != strings.end())
    ::setenv("_", underscore->c_str() + 2, 1);
  else
    ::unsetenv("_");
  std::vector<char*> argv;
  for (uint32_t i = 0; i < argc; ++i) argv.push_back(const_cast<char*>(strings[1 + i].c_str()));
  argv.push_back(nullptr);
  const int status = run_tests(static_cast<int>(argc), argv.data());
  // gtest has decided and said everything. What exit() would add is LibTorch tearing down its
  // operator registry, 95 ms a test here (strace: no system call in between), the same each
  // time and still run at the end of every dptrain process and of the sanitizer binary's run.
  std::fflush(nullptr);
  ::_exit(status);
}

// SIGKILL for every process below this one, as CTest's timeout kills a test's process tree: the
// test's own children may have left its process group (tests/support's run_command puts each in
// one of its own). This process is a subreaper (handle_client), so the orphans of a killed
// process become its children in turn; it is done when it has none left.
void kill_descendants() {
  const pid_t self = ::getpid();
  while (true) {
    if (DIR* processes = ::opendir("/proc")) {
      for (dirent* entry = ::readdir(processes); entry; entry = ::readdir(processes)) {
        const pid_t pid = static_cast<pid_t>(std::atoi(entry->d_name));
        if (pid <= 0) continue;
        std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
        std::string line;
        std::getline(stat, line);
        const size_t name_end = line.rfind(')');  // the name may hold spaces and ')'
        if (name_end == std::string::npos) continue;
        char state = 0;
        int parent = 0;
        if (std::sscanf(line.c_str() + name_end + 1, " %c %d", &state, &parent) == 2 &&
            parent == self) {
          ::kill(pid, SIGKILL);
        }
      }
      ::closedir(processes);
    }
    if (::waitpid(-1, nullptr, 0) < 0 && errno == ECHILD) return;
  }
}

// Waits for the test to end (its status goes back to the client) or for the client to go (CTest's
// timeout killed it: the test and everything below it are killed too). Never returns.
[[noreturn]] void watch_test(int connection, pid_t test) {
  const int test_ended = open_pidfd(test);
  while (true) {
    pollfd watched[2] = {{connection, POLLIN, 0}, {test_ended, POLLIN, 0}};
    // Without a pidfd, the test is polled every 10 ms.
    const int ready = ::poll(watched, test_ended >= 0 ? 2 : 1, test_ended >= 0 ? -1 : 10);
    if (ready < 0 && errno != EINTR) break;
    int status = 0;
    const pid_t ended = ::waitpid(test, &status, WNOHANG);
    if (ended == test) {
      if (WIFSIGNALED(status))
        send_reply(connection, Outcome::kSignaled, WTERMSIG(status));
      else
        send_reply(connection, Outcome::kExited, WEXITSTATUS(status));
      ::_exit(0);
    }
    if (ready > 0 && watched[0].revents != 0) break;  // the client sends nothing more: it is gone
  }
  ::kill(-test, SIGKILL);
  kill_descendants();
  ::_exit(0);
}

// One client, in a child of the server. Never returns.
[[noreturn]] void handle_client(const Server& server, int connection,
                                int (*run_tests)(int, char**)) {
  ::sigaction(SIGTERM, &server.original_sigterm, nullptr);
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);  // see kill_descendants
  // A client sends its request at once; one that connects and says nothing is not waited for.
  const timeval request_time{10, 0};
  ::setsockopt(connection, SOL_SOCKET, SO_RCVTIMEO, &request_time, sizeof(request_time));
  Request request;
  int fds[forked::kPassedDescriptors] = {-1, -1, -1};
  std::vector<std::string> strings;
  if (!receive_request(connection, request, fds) || !read_strings(connection, request, strings)) {
    // Whatever came, the client gets an answer it acts on: it runs the test itself.
    send_reply(connection, Outcome::kNotServed, 0);
    ::_exit(1);
  }
  if (request.kind == RequestKind::kStop) {
    send_reply(connection, Outcome::kStopping, 0);
    ::kill(::getppid(), SIGTERM);
    ::_exit(0);
  }
  const auto environment =
      comparable_environment({strings.begin() + 1 + request.argc, strings.end()});
  if (request.kind != RequestKind::kRun || fds[2] < 0 || !(request.binary == server.binary) ||
      environment != server.environment) {
    send_reply(connection, Outcome::kNotServed, 0);
    ::_exit(0);
  }
  ::sigaction(SIGCHLD, &server.original_sigchld, nullptr);  // this child waits for its test
  std::fflush(nullptr);
  const pid_t test = ::fork();
  if (test < 0) {
    send_reply(connection, Outcome::kNotServed, 0);
    ::_exit(0);
  }
  if (test == 0) run_test(server, connection, fds, strings, request.argc, run_tests);
  ::setpgid(test, test);  // also here, so that a kill right after the fork finds the group
  for (int fd : fds) ::close(fd);
  watch_test(connection, test);
}

bool peer_is_this_user(int connection) {
  ucred peer{};
  socklen_t size = sizeof(peer);
  return ::getsockopt(connection, SOL_SOCKET, SO_PEERCRED, &peer, &size) == 0 &&
         peer.uid == ::geteuid();
}

// The accept loop, in the detached server; ends when the watched process (CTest) ends or a
// client asks it to stop. Never returns.
[[noreturn]] void serve(const Server& server, int listening, pid_t watched,
                        int (*run_tests)(int, char**)) {
  const int watched_ended = open_pidfd(watched);
  while (!stop_requested) {
    pollfd events[2] = {{listening, POLLIN, 0}, {watched_ended, POLLIN, 0}};
    // Without a pidfd, the watched process is looked for every second.
    const int ready = ::poll(events, watched_ended >= 0 ? 2 : 1, watched_ended >= 0 ? -1 : 1000);
    if (watched_ended >= 0 ? (ready > 0 && events[1].revents != 0)
                           : (::kill(watched, 0) != 0 && errno == ESRCH)) {
      break;
    }
    if (ready <= 0 || events[0].revents == 0) continue;
    const int connection = ::accept4(listening, nullptr, nullptr, SOCK_CLOEXEC);
    if (connection < 0) continue;
    if (peer_is_this_user(connection)) {
      std::fflush(nullptr);
      const pid_t handler = ::fork();
      if (handler == 0) {
        ::close(listening);
        if (watched_ended >= 0) ::close(watched_ended);
        handle_client(server, connection, run_tests);
      }
    }
    ::close(connection);
  }
  struct stat socket_info {};
  if (::lstat(server.socket_path.c_str(), &socket_info) == 0 &&
      socket_info.st_ino == server.socket_inode) {
    ::unlink(server.socket_path.c_str());  // only our own: a newer server may have taken the name
  }
  ::_exit(0);
}

// Removes a socket at `path` that nobody serves any more and that is this user's; false when
// something else is there (a live server, another user's file): it is left as it is.
bool clear_stale_socket(const std::string& path, std::string& why) {
  struct stat info {};
  if (::lstat(path.c_str(), &info) != 0) return true;
  if (!S_ISSOCK(info.st_mode) || info.st_uid != ::geteuid()) {
    why = path + " exists and is not this user's socket";
    return false;
  }
  const int probe = forked::connect_to(path);
  if (probe >= 0) {
    ::close(probe);
    why = "another server already serves " + path;
    return false;
  }
  return ::unlink(path.c_str()) == 0 || errno == ENOENT;
}

int not_serving(const std::string& why) {
  std::printf("forked test server: not serving (%s); each test starts the binary itself\n",
              why.c_str());
  return 0;
}

}  // namespace

int serve_forked_tests(int (*run_tests)(int argc, char** argv)) {
  if (const int threads = current_thread_count(); threads != 1) {
    return not_serving("the binary has " + std::to_string(threads) +
                       " threads before any test, and a fork keeps one");
  }
  Server server;
  char binary[PATH_MAX];
  if (::realpath("/proc/self/exe", binary) == nullptr ||
      !forked::identify_binary(binary, server.binary)) {
    return not_serving(std::string("/proc/self/exe: ") + std::strerror(errno));
  }
  std::vector<std::string> environment;
  for (char** entry = environ; entry && *entry; ++entry) environment.emplace_back(*entry);
  server.environment = comparable_environment(std::move(environment));
  server.socket_path = forked::socket_path_for(binary);
  ::sigaction(SIGCHLD, nullptr, &server.original_sigchld);
  ::sigaction(SIGTERM, nullptr, &server.original_sigterm);

  std::string why;
  if (!clear_stale_socket(server.socket_path, why)) return not_serving(why);
  const int listening = forked::listen_at(server.socket_path);
  struct stat socket_info {};
  if (listening < 0 || ::lstat(server.socket_path.c_str(), &socket_info) != 0) {
    return not_serving(server.socket_path + ": " + std::strerror(errno));
  }
  server.socket_inode = socket_info.st_ino;

  // The server outlives the fixture that started it (CTest waits for that one to end) and
  // watches CTest itself, the fixture's parent: it is gone when CTest is, however CTest ends.
  const pid_t watched = ::getppid();
  std::fflush(nullptr);
  const pid_t daemon = ::fork();
  if (daemon < 0) return not_serving(std::string("fork: ") + std::strerror(errno));
  if (daemon > 0) {
    std::printf("forked test server: serving %s while process %d runs\n",
                server.socket_path.c_str(), static_cast<int>(watched));
    return 0;
  }
  ::setsid();
  // CTest reads the fixture's output until every holder closes it: the server keeps none.
  const int null = ::open("/dev/null", O_RDWR);
  for (int target = 0; target < 3; ++target) ::dup2(null, target);
  if (null > 2) ::close(null);
  struct sigaction reap {};
  reap.sa_handler = SIG_IGN;  // the handlers' exit statuses are not needed: no zombies
  ::sigaction(SIGCHLD, &reap, nullptr);
  struct sigaction stop {};
  stop.sa_handler = request_stop;  // no SA_RESTART: poll returns and the loop sees the flag
  ::sigaction(SIGTERM, &stop, nullptr);
  serve(server, listening, watched, run_tests);
}

}  // namespace dptrain::testing
