// Atomic file writes and directory syncs. See durable_file.h.
#include "dptrain/durable_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "dptrain/errors.h"

namespace dptrain {

void sync_directory(const std::string& directory) {
  const int fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

void sync_parent_directory(const std::string& path) {
  const size_t slash = path.rfind('/');
  sync_directory(slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash)));
}

void write_file_atomically(const std::string& path, const void* data, size_t size,
                           const std::string& what, const std::string& note) {
  const std::string temporary = path + ".tmp";
  // `errno` holds the cause; `fd`, when open, is closed without disturbing it.
  const auto fail = [&](const std::string& step, int fd) {
    const std::string reason = std::strerror(errno);
    if (fd >= 0) ::close(fd);
    ::unlink(temporary.c_str());
    throw DataError(what + ": cannot " + step + ": " + reason + note);
  };
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("create " + temporary, -1);
  const auto* bytes = static_cast<const char*>(data);
  for (size_t done = 0; done < size;) {
    const ssize_t n = ::write(fd, bytes + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n == 0) errno = ENOSPC;
      fail("write " + temporary, fd);
    }
    done += static_cast<size_t>(n);
  }
  // The data must be on disk before the rename gives it the final name.
  if (::fsync(fd) != 0) fail("flush " + temporary + " to disk", fd);
  if (::close(fd) != 0) fail("close " + temporary, -1);
  if (::rename(temporary.c_str(), path.c_str()) != 0)
    fail("rename " + temporary + " into place", -1);
  sync_parent_directory(path);
}

}  // namespace dptrain
