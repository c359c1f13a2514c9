// Whole-file reads, mkdir -p, output checks, atomic writes and directory syncs. See files.h.
//
// Note [No std::filesystem]
// PyPI's libtorch_cpu.so (2.x) exports the std::filesystem symbols of the libstdc++ it was
// statically linked with (pytorch/pytorch#133437, "PyTorch 2.5.0 exposes statically linked
// libstdc++ CXX11 ABI symbols"). Linked into dptrain they stand in for the system libstdc++'s,
// and calls compiled against our headers then run their code on our objects and crash. So
// every file operation in dptrain is a POSIX call, here or beside its one user.
#include "dptrain/core/files.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dptrain/core/devices.h"
#include "dptrain/core/errors.h"

namespace dptrain {
namespace {

// Closes a descriptor on every path out of a function, keeping errno as the failure set it.
class FileDescriptor {
 public:
  explicit FileDescriptor(int fd) : fd_(fd) {}
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  ~FileDescriptor() {
    if (fd_ >= 0) {
      const int saved = errno;
      ::close(fd_);
      errno = saved;
    }
  }
  int get() const { return fd_; }
  // Hands the descriptor over: this object no longer closes it.
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }
  // Closes now and reports close(2)'s own failure (a deferred write error on some file systems).
  bool close() {
    const int fd = fd_;
    fd_ = -1;
    return ::close(fd) == 0;
  }

 private:
  int fd_;
};

// Temporary names are unique within the process (a counter) and across processes (the pid),
// and end in ".tmp" so that nobody takes one for a finished file.
std::string temporary_name(const std::string& path) {
  static std::atomic<uint64_t> counter{0};
  return path + "." + std::to_string(::getpid()) + "-" + std::to_string(counter++) + ".tmp";
}

// Creates a new temporary file beside `path`: O_EXCL fails on any existing name, a symbolic
// link included, so nothing that already stands there is ever written through.
int create_temporary(const std::string& path, std::string& temporary) {
  for (int attempt = 0; attempt < 100; ++attempt) {
    temporary = temporary_name(path);
    const int fd =
        ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd >= 0 || errno != EEXIST) return fd;
  }
  return -1;  // errno is EEXIST
}

}  // namespace

std::string errno_text(int error) { return std::strerror(error); }

std::string parent_directory(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

std::string file_kind(unsigned mode) {
  switch (mode & S_IFMT) {
    case S_IFREG:
      return "a regular file";
    case S_IFDIR:
      return "a directory";
    case S_IFLNK:
      return "a symbolic link";
    case S_IFIFO:
      return "a FIFO";
    case S_IFSOCK:
      return "a socket";
    case S_IFCHR:
      return "a character device";
    case S_IFBLK:
      return "a block device";
    default:
      return "not a regular file";
  }
}

void make_directories(const std::string& directory, const std::string& what) {
  // One component at a time, from the root down.
  for (size_t slash = directory.find('/', 1);; slash = directory.find('/', slash + 1)) {
    const std::string prefix = directory.substr(0, slash);
    if (!prefix.empty() && ::mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) {
      throw DataError(what + ": cannot create " + prefix + ": " + errno_text());
    }
    if (slash == std::string::npos) break;
  }
  struct stat info {};
  if (::stat(directory.c_str(), &info) != 0 || !S_ISDIR(info.st_mode)) {
    throw DataError(what + ": " + directory + " is not a directory");
  }
}

RegularFile::RegularFile(const std::string& path, const std::string& what)
    : name_(what.empty() ? path : what + " " + path) {
  // O_NONBLOCK: opening a FIFO would otherwise wait for a writer, for ever.
  fd_ = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd_ < 0) throw DataError(name_ + ": cannot open: " + errno_text());
  struct stat info {};
  if (::fstat(fd_, &info) != 0) {
    const std::string reason = errno_text();
    ::close(fd_);
    throw DataError(name_ + ": cannot stat: " + reason);
  }
  if (!S_ISREG(info.st_mode)) {
    ::close(fd_);
    throw DataError(name_ + ": not a regular file (" + file_kind(info.st_mode) + ")");
  }
  size_ = static_cast<uint64_t>(info.st_size);
}

RegularFile::~RegularFile() { ::close(fd_); }

void RegularFile::read_at(uint64_t offset, void* out, size_t size) const {
  auto* bytes = static_cast<uint8_t*>(out);
  size_t done = 0;
  while (done < size) {
    const ssize_t n =
        ::pread(fd_, bytes + done, size - done, static_cast<off_t>(offset + done));
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n < 0) throw DataError(name_ + ": read error: " + errno_text());
    if (n == 0) throw DataError(name_ + ": read error: the file shrank while it was read");
    done += static_cast<size_t>(n);
  }
}

std::vector<uint8_t> read_regular_file(const std::string& path, const std::string& what,
                                       uint64_t max_bytes, const std::string& limit_reason) {
  const RegularFile file(path, what);
  if (file.size() > max_bytes) {
    throw DataError(file.name() + ": " + std::to_string(file.size()) + " bytes, more than " +
                    limit_reason + " (at most " + std::to_string(max_bytes) + "); not read");
  }
  std::vector<uint8_t> bytes(static_cast<size_t>(file.size()));
  file.read_at(0, bytes.data(), bytes.size());
  return bytes;
}

namespace {

// Note [Untrusted text in messages], both steps: `quoted` is printable's (only printable ASCII
// passes, a backslash doubled), else message_line's (control bytes escaped, a newline as \n).
std::string escape_untrusted(const std::string& text, bool quoted) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (quoted && byte == '\\') {
      out += "\\\\";
    } else if (!quoted && byte == '\n') {
      out += "\\n";
    } else if (byte < 0x20 || byte == 0x7f || (quoted && byte >= 0x80)) {
      char escaped[5];
      std::snprintf(escaped, sizeof escaped, "\\x%02x", byte);
      out += escaped;
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

std::string printable(const std::string& text) { return escape_untrusted(text, /*quoted=*/true); }

std::string message_line(const std::string& text) {
  return escape_untrusted(text, /*quoted=*/false);
}

int try_create_beside(const std::string& path, std::string* trial) {
  // Counting down from 2^64 - 1: the widest counter a temporary name takes, and never one that a
  // writer of this process (counting up) or another probe uses. Named like a real temporary, a
  // trial left by a process killed between the two calls is a stale temporary like any other.
  static std::atomic<uint64_t> trials{0};
  const std::string name = path + "." + std::to_string(::getpid()) + "-" +
                           std::to_string(std::numeric_limits<uint64_t>::max() - trials++) +
                           ".tmp";
  if (trial != nullptr) *trial = name;
  const int fd = ::open(name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return errno;
  ::close(fd);
  ::unlink(name.c_str());
  return 0;
}

void check_output_file(const std::string& path, const std::string& flag) {
  struct stat info {};
  if (::lstat(path.c_str(), &info) == 0) {
    if (!S_ISREG(info.st_mode)) {
      throw UsageError(flag + " " + path + ": is " + file_kind(info.st_mode) +
                       "; dptrain writes a new file or replaces a regular one, nothing else");
    }
  } else if (errno != ENOENT) {
    throw UsageError(flag + " " + path + ": cannot look at it: " + errno_text());
  }
  const std::string directory = parent_directory(path);
  if (::stat(directory.c_str(), &info) != 0) {
    throw UsageError(flag + " " + path + ": its directory " + directory +
                     " cannot be used: " + errno_text());
  }
  if (!S_ISDIR(info.st_mode)) {
    throw UsageError(flag + " " + path + ": " + directory + " is not a directory");
  }
  if (const int error = try_create_beside(path)) {
    throw UsageError(flag + " " + path + ": cannot create a file in " + directory + ": " +
                     errno_text(error));
  }
}

namespace {

// realpath(3), or nullopt when `path` cannot be resolved (missing, no permission on the way).
std::optional<std::string> real_path(const std::string& path) {
  char* resolved = ::realpath(path.c_str(), nullptr);
  if (resolved == nullptr) return std::nullopt;
  std::string out(resolved);
  std::free(resolved);
  return out;
}

}  // namespace

FileIdentity file_identity(const std::string& path) {
  FileIdentity identity;
  struct stat info {};
  // stat, not lstat: an input that is a symbolic link is the file it leads to.
  if (::stat(path.c_str(), &info) == 0) {
    identity.exists = true;
    identity.device = static_cast<uint64_t>(info.st_dev);
    identity.inode = static_cast<uint64_t>(info.st_ino);
    if (auto resolved = real_path(path)) {
      identity.real_path = std::move(*resolved);
      return identity;
    }
  }
  // A file still to be made: where its directory really is, plus its name.
  const size_t slash = path.rfind('/');
  const std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  if (auto directory = real_path(parent_directory(path))) {
    identity.real_path = *directory + (directory->back() == '/' ? "" : "/") + name;
  } else {
    identity.real_path = path;
  }
  return identity;
}

bool same_file(const FileIdentity& a, const FileIdentity& b) {
  if (a.exists && b.exists && a.device == b.device && a.inode == b.inode) return true;
  return a.real_path == b.real_path;
}

void check_distinct_files(const std::vector<RoleFile>& outputs,
                          const std::vector<RoleFile>& inputs) {
  std::vector<FileIdentity> output_ids, input_ids;
  for (const auto& file : outputs) output_ids.push_back(file_identity(file.path));
  for (const auto& file : inputs) input_ids.push_back(file_identity(file.path));
  const auto refuse = [](const RoleFile& output, const RoleFile& other, const FileIdentity& id,
                         const char* what) {
    throw UsageError(output.role + " and " + other.role + " name one file, " +
                     printable(id.real_path) + "; " + what + ": give it another name");
  };
  for (size_t i = 0; i < outputs.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (same_file(output_ids[i], output_ids[j])) {
        refuse(outputs[j], outputs[i], output_ids[i],
               "each output needs a file of its own, or one would replace the other");
      }
    }
    for (size_t j = 0; j < inputs.size(); ++j) {
      if (same_file(output_ids[i], input_ids[j])) {
        refuse(outputs[i], inputs[j], output_ids[i],
               "a run never writes over a file it reads or keeps");
      }
    }
  }
}

namespace {

// The line a lock file holds: who holds it, for the message a second run prints.
std::string lock_holder_line() {
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  char started[32] = {0};
  if (::localtime_r(&now, &local) != nullptr) {
    std::strftime(started, sizeof started, "%Y-%m-%d %H:%M:%S", &local);
  }
  return "pid " + std::to_string(::getpid()) + " on " + host_name() + ", since " + started + "\n";
}

// What the lock file open as `fd` says of its holder, made printable (another program's bytes,
// maybe: never raw to the terminal).
std::string read_lock_holder(int fd) {
  char holder[256] = {0};
  const ssize_t n = ::pread(fd, holder, sizeof holder - 1, 0);
  std::string who = n > 0 ? std::string(holder, static_cast<size_t>(n)) : "";
  while (!who.empty() && (who.back() == '\n' || who.back() == '\0')) who.pop_back();
  return printable(who);
}

}  // namespace

HolderLock::HolderLock(std::string lock_path, const std::string& what, bool remove_when_done)
    : lock_path_(std::move(lock_path)), remove_when_done_(remove_when_done) {
  // A few rounds at most: each new round means a holder removed the file just as it ended.
  for (int round = 0;; ++round) {
    FileDescriptor fd(
        ::open(lock_path_.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644));
    if (fd.get() < 0) {
      throw DataError(what + ": cannot open its lock file " + lock_path_ + ": " + errno_text());
    }
    struct stat info {};
    if (::fstat(fd.get(), &info) != 0 || !S_ISREG(info.st_mode) || info.st_nlink != 1) {
      const std::string kind = !S_ISREG(info.st_mode) ? "is " + file_kind(info.st_mode)
                                                      : "has " + std::to_string(info.st_nlink) +
                                                            " hard links (another name shares it)";
      throw DataError(what + ": its lock file " + lock_path_ + " " + kind +
                      "; dptrain writes into it who holds the lock, so it must be a file of its "
                      "own: remove it");
    }
    if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
      const int error = errno;
      if (error != EWOULDBLOCK) {
        throw DataError(what + ": cannot lock " + lock_path_ + ": " + errno_text(error));
      }
      throw Held(read_lock_holder(fd.get()));
    }
    struct stat now {};
    if (::lstat(lock_path_.c_str(), &now) == 0 && now.st_dev == info.st_dev &&
        now.st_ino == info.st_ino) {
      fd_ = fd.release();
      break;
    }
    // The name now leads elsewhere: the lock held (dropped as `fd` closes) guards nothing.
    if (round == 8) {
      throw DataError(what + ": its lock file " + lock_path_ +
                      " keeps being replaced; is another program removing it?");
    }
  }
  const std::string text = lock_holder_line();
  if (::ftruncate(fd_, 0) == 0) (void)!::pwrite(fd_, text.data(), text.size(), 0);
}

HolderLock::~HolderLock() {
  if (fd_ < 0) return;
  // Removed while still held: a process that opened it meanwhile finds the name gone once it
  // holds the flock, and starts again (Note [Lock files that name their holder]).
  if (remove_when_done_) ::unlink(lock_path_.c_str());
  ::close(fd_);  // releases the flock
}

std::string OutputLock::lock_path(const std::string& path) {
  const size_t slash = path.rfind('/');
  const std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  const std::string directory = slash == std::string::npos ? "" : path.substr(0, slash + 1);
  return directory + "." + name + ".lock";
}

std::string OutputLock::directory_lock_path(const std::string& directory) {
  return directory + "/.dptrain-writer.lock";
}

OutputLock::OutputLock(const std::string& path, const std::string& flag, OutputKind kind) {
  const std::string name = flag + " " + path;
  const bool directory = kind == OutputKind::kDirectory;
  try {
    lock_ = std::make_unique<HolderLock>(directory ? directory_lock_path(path) : lock_path(path),
                                         name, /*remove_when_done=*/true);
  } catch (const HolderLock::Held& held) {
    throw UsageError(name + " is being written by another dptrain run" +
                     (held.holder().empty() ? std::string() : " (" + held.holder() + ")") +
                     "; wait for it to end, or give this run " +
                     (directory ? "a directory" : "a file") + " of its own");
  }
}

void sync_directory(const std::string& directory) {
  FileDescriptor fd(::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() >= 0) ::fsync(fd.get());
}

void sync_parent_directory(const std::string& path) { sync_directory(parent_directory(path)); }

int write_all(int fd, const void* data, size_t size) {
  const auto* bytes = static_cast<const char*>(data);
  for (size_t done = 0; done < size;) {
    const ssize_t n = ::write(fd, bytes + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno;
    if (n == 0) return ENOSPC;
    done += static_cast<size_t>(n);
  }
  return 0;
}

void write_file_atomically(const std::string& path, const void* data, size_t size,
                           const std::string& what, const std::string& note) {
  std::string temporary;
  // `errno` holds the cause when this is called.
  const auto fail = [&](const std::string& step) {
    const std::string reason = errno_text();
    if (!temporary.empty()) ::unlink(temporary.c_str());
    throw DataError(what + ": cannot " + step + ": " + reason + note);
  };
  // Only a regular file is replaced: a rename over /dev/full, a FIFO or a link would swap a
  // file in for what the user had there.
  const auto refuse_non_regular = [&] {
    struct stat info {};
    if (::lstat(path.c_str(), &info) == 0 && !S_ISREG(info.st_mode)) {
      if (!temporary.empty()) ::unlink(temporary.c_str());
      throw DataError(what + ": " + path + " is " + file_kind(info.st_mode) +
                      "; only a regular file is replaced" + note);
    }
  };
  refuse_non_regular();
  FileDescriptor fd(create_temporary(path, temporary));
  if (fd.get() < 0) {
    const std::string step = "create a temporary file beside " + path;
    temporary.clear();  // nothing of ours to remove
    fail(step);
  }
  if (const int error = write_all(fd.get(), data, size)) {
    errno = error;
    fail("write " + temporary);
  }
  // The data must be on disk before the rename gives it the final name.
  if (::fsync(fd.get()) != 0) fail("flush " + temporary + " to disk");
  if (!fd.close()) fail("close " + temporary);
  refuse_non_regular();  // again: something may have appeared there meanwhile
  if (::rename(temporary.c_str(), path.c_str()) != 0) fail("rename " + temporary + " into place");
  sync_parent_directory(path);
}

}  // namespace dptrain
