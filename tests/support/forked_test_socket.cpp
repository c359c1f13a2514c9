// Where the forked test server's socket lives, and binding or connecting to it; see
// forked_test_socket.h.
#include "support/forked_test_socket.h"

#include <fcntl.h>
#include <limits.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "support/forked_test_protocol.h"

namespace dptrain::testing::forked {
namespace {

// sun_path holds 108 bytes and a build directory may be deeper than that, so the socket is
// named relative to its directory, from inside it; both callers are single-threaded there.
// Returns the result of `act(fd, name)` on a new socket, or -1 with errno set.
template <typename Act>
int in_directory_of(const std::string& path, Act act) {
  const size_t slash = path.rfind('/');
  const std::string directory = slash == std::string::npos ? "." : path.substr(0, slash + 1);
  const std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  sockaddr_un address{};
  if (name.empty() || name.size() >= sizeof(address.sun_path)) {
    errno = ENAMETOOLONG;
    return -1;
  }
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path, name.c_str(), name.size() + 1);
  const int here = ::open(".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (here < 0) return -1;
  int fd = -1;
  if (::chdir(directory.c_str()) == 0) {
    fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd >= 0 && act(fd, address) != 0) {
      const int saved = errno;
      ::close(fd);
      fd = -1;
      errno = saved;
    }
  }
  const int saved = errno;
  if (::fchdir(here) != 0 && fd >= 0) {  // the caller's working directory must come back
    ::close(fd);
    fd = -1;
  }
  ::close(here);
  errno = saved;
  return fd;
}

}  // namespace

std::string socket_path_for(const std::string& binary) {
  if (const char* chosen = std::getenv("DPTRAIN_FORKED_TEST_SOCKET"); chosen && *chosen) {
    return chosen;
  }
  char resolved[PATH_MAX];
  if (::realpath(binary.c_str(), resolved) == nullptr) return "";
  return std::string(resolved) + kSocketSuffix;
}

int listen_at(const std::string& path) {
  return in_directory_of(path, [](int fd, const sockaddr_un& address) {
    // Made 0600 without touching the process's umask, which a forked test inherits; until the
    // chmod the umask's mode holds (no write bit for others under 022), and the server also
    // checks every peer's uid.
    if (::bind(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0) return -1;
    if (::chmod(address.sun_path, 0600) != 0) return -1;
    return ::listen(fd, 64);
  });
}

int connect_to(const std::string& path) {
  return in_directory_of(path, [](int fd, const sockaddr_un& address) {
    return ::connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address));
  });
}

bool read_exactly(int fd, void* buffer, size_t size) {
  auto* bytes = static_cast<char*>(buffer);
  while (size > 0) {
    const ssize_t got = ::read(fd, bytes, size);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    bytes += got;
    size -= static_cast<size_t>(got);
  }
  return true;
}

bool write_all(int fd, const void* buffer, size_t size) {
  const auto* bytes = static_cast<const char*>(buffer);
  while (size > 0) {
    const ssize_t sent = ::send(fd, bytes, size, MSG_NOSIGNAL);
    if (sent < 0 && errno == EINTR) continue;
    if (sent <= 0) return false;
    bytes += sent;
    size -= static_cast<size_t>(sent);
  }
  return true;
}

}  // namespace dptrain::testing::forked
