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

bool identify_binary(const std::string& path, BinaryIdentity& identity) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) return false;
  identity.device = info.st_dev;
  identity.inode = info.st_ino;
  identity.mtime_ns = static_cast<int64_t>(info.st_mtim.tv_sec) * 1000000000 + info.st_mtim.tv_nsec;
  return true;
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

namespace {

// A one-part message over `buffer` whose control data is `control`.
msghdr message_over(iovec& part, char* control, size_t control_size) {
  msghdr message{};
  message.msg_iov = &part;
  message.msg_iovlen = 1;
  message.msg_control = control;
  message.msg_controllen = control_size;
  return message;
}

constexpr size_t kDescriptorBytes = sizeof(int) * kPassedDescriptors;

}  // namespace

bool send_with_standard_descriptors(int socket, const void* buffer, size_t size) {
  const int fds[kPassedDescriptors] = {0, 1, 2};
  char control[CMSG_SPACE(kDescriptorBytes)] = {};
  iovec part{const_cast<void*>(buffer), size};
  msghdr message = message_over(part, control, sizeof(control));
  cmsghdr* header = CMSG_FIRSTHDR(&message);
  header->cmsg_level = SOL_SOCKET;
  header->cmsg_type = SCM_RIGHTS;
  header->cmsg_len = CMSG_LEN(kDescriptorBytes);
  std::memcpy(CMSG_DATA(header), fds, kDescriptorBytes);
  ssize_t sent;
  do {
    sent = ::sendmsg(socket, &message, MSG_NOSIGNAL);
  } while (sent < 0 && errno == EINTR);
  return sent == static_cast<ssize_t>(size);
}

bool receive_with_descriptors(int socket, void* buffer, size_t size,
                              int (&fds)[kPassedDescriptors]) {
  for (int& fd : fds) fd = -1;
  char control[CMSG_SPACE(kDescriptorBytes)];
  iovec part{buffer, size};
  msghdr message = message_over(part, control, sizeof(control));
  const ssize_t got = ::recvmsg(socket, &message, MSG_CMSG_CLOEXEC | MSG_WAITALL);
  if (got < 0) return false;
  for (cmsghdr* header = CMSG_FIRSTHDR(&message); header; header = CMSG_NXTHDR(&message, header)) {
    if (header->cmsg_level == SOL_SOCKET && header->cmsg_type == SCM_RIGHTS &&
        header->cmsg_len == CMSG_LEN(kDescriptorBytes)) {
      std::memcpy(fds, CMSG_DATA(header), kDescriptorBytes);
    }
  }
  return got == static_cast<ssize_t>(size);
}

}  // namespace dptrain::testing::forked
