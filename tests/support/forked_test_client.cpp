// dptrain_test_client: CTest's launcher for the test binary. It hands the test to the binary's
// forked test server when one serves it (Note [Tests forked from a loaded binary],
// forked_test_server.cpp) and otherwise becomes the binary itself, so a test runs either way.
//   dptrain_test_client BINARY [ARGS...]   run BINARY ARGS: served, or exec'd in place
//   dptrain_test_client --stop BINARY      stop the server of BINARY, if one runs
// Not here: the server, and LibTorch: this program loads neither, which is the point.
#include <limits.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "support/forked_test_protocol.h"
#include "support/forked_test_socket.h"

extern char** environ;

namespace {

namespace forked = dptrain::testing::forked;
using forked::Outcome;
using forked::Reply;
using forked::Request;
using forked::RequestKind;

// Sends the request, with descriptors 0-2 attached to its header, and its strings.
bool send_request(int connection, Request request, const std::string& payload) {
  request.payload_bytes = payload.size();
  return forked::send_with_standard_descriptors(connection, &request, sizeof(request)) &&
         forked::write_all(connection, payload.data(), payload.size());
}

// Ends this process as the test ended: with its exit status, or by its signal (no core file:
// the test's own process already had its chance to leave one).
[[noreturn]] void end_as(const Reply& reply) {
  if (reply.outcome == Outcome::kSignaled && reply.value > 0 && reply.value < NSIG) {
    const rlimit no_core{0, 0};
    ::setrlimit(RLIMIT_CORE, &no_core);
    ::signal(reply.value, SIG_DFL);
    sigset_t only;
    sigemptyset(&only);
    sigaddset(&only, reply.value);
    ::sigprocmask(SIG_UNBLOCK, &only, nullptr);
    ::raise(reply.value);
    ::_exit(128 + reply.value);  // a signal whose default is to continue
  }
  if (reply.outcome == Outcome::kExited) ::_exit(reply.value);
  std::fprintf(stderr,
               "dptrain_test_client: the forked test server answered %u/%d, no exit status\n",
               static_cast<unsigned>(reply.outcome), reply.value);
  ::_exit(1);
}

[[noreturn]] void run_in_place(char** argv) {
  ::execvp(argv[0], argv);
  std::fprintf(stderr, "dptrain_test_client: cannot run %s: %s\n", argv[0], std::strerror(errno));
  ::_exit(127);
}

int stop(const char* binary) {
  const int connection = forked::connect_to(forked::socket_path_for(binary));
  Reply reply;
  Request request;
  request.kind = RequestKind::kStop;
  request.argc = 1;
  const std::string payload = std::string("/") + '\0' + binary + '\0';
  if (connection < 0 || !send_request(connection, request, payload) ||
      !forked::read_exactly(connection, &reply, sizeof(reply)) ||
      reply.outcome != Outcome::kStopping) {
    std::printf("dptrain_test_client: no forked test server serves %s\n", binary);
    return 0;
  }
  std::printf("dptrain_test_client: the forked test server of %s stops\n", binary);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::strcmp(argv[1], "--stop") == 0) return stop(argv[2]);
  if (argc < 2) {
    std::fprintf(stderr, "usage: dptrain_test_client BINARY [ARGS...] | --stop BINARY\n");
    return 2;
  }
  char** test_argv = argv + 1;
  Request request;
  char cwd[PATH_MAX];
  const std::string socket = forked::socket_path_for(test_argv[0]);
  if (socket.empty() || !forked::identify_binary(test_argv[0], request.binary) ||
      !::getcwd(cwd, sizeof(cwd))) {
    run_in_place(test_argv);
  }
  const int connection = forked::connect_to(socket);
  if (connection < 0) run_in_place(test_argv);  // nobody serves: as CTest would run it

  request.argc = static_cast<uint32_t>(argc - 1);
  std::string payload = std::string(cwd) + '\0';
  for (char** arg = test_argv; *arg; ++arg) payload += std::string(*arg) + '\0';
  for (char** entry = environ; entry && *entry; ++entry) {
    payload += std::string(*entry) + '\0';
    ++request.envc;
  }
  if (payload.size() > forked::kMaxPayloadBytes || !send_request(connection, request, payload)) {
    ::close(connection);
    run_in_place(test_argv);  // the request did not get through (or is too large to): nothing ran
  }
  Reply reply;
  if (!forked::read_exactly(connection, &reply, sizeof(reply))) {
    // The test may have run and written its output: running it again would hide what happened.
    std::fprintf(stderr,
                 "dptrain_test_client: the forked test server ended without the exit status "
                 "of %s; run it alone to see\n",
                 test_argv[0]);
    return 1;
  }
  if (reply.outcome == Outcome::kNotServed) {
    ::close(connection);
    run_in_place(test_argv);
  }
  end_as(reply);
}
