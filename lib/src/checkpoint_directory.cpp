// Preparing, locking and searching a checkpoint directory. See checkpoint_directory.h.
#include "dptrain/train/checkpoint_directory.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <tuple>

#include "dptrain/errors.h"
#include "dptrain/io/files.h"
#include "dptrain/parallel/devices.h"

namespace dptrain {
namespace {

constexpr char kLockFileName[] = ".dptrain.lock";

bool is_checkpoint_file_name(const std::string& name) {
  const std::string prefix = "checkpoint-";
  const std::string suffix = ".dpt";
  return name.size() > prefix.size() + suffix.size() && name.rfind(prefix, 0) == 0 &&
         name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The order of positions: complete epochs, then steps into the next, then the step count.
std::tuple<int64_t, int64_t, int64_t> position(const Checkpoint& checkpoint) {
  return {checkpoint.epochs_done, checkpoint.step_in_epoch, checkpoint.global_step};
}

}  // namespace

void prepare_checkpoint_directory(const std::string& directory) {
  make_directories(directory, "checkpoint directory " + directory);
  if (::access(directory.c_str(), W_OK | X_OK) != 0) {
    throw DataError("checkpoint directory " + directory + ": not writable: " + errno_text());
  }
}

std::string checkpoint_file_name(int64_t epochs_done, int64_t step_in_epoch) {
  char name[64];
  std::snprintf(name, sizeof name, "checkpoint-e%04lld-s%06lld.dpt",
                static_cast<long long>(epochs_done), static_cast<long long>(step_in_epoch));
  return name;
}

bool named_before(const std::string& a, const std::string& b) {
  // The zero-padded names sort by position; wider numbers (epoch 10000 and up) sort by length.
  return a.size() != b.size() ? a.size() < b.size() : a < b;
}

std::vector<std::string> checkpoint_file_names(const std::string& directory) {
  DIR* dir = ::opendir(directory.c_str());
  if (dir == nullptr) {
    if (errno == ENOENT) return {};
    throw DataError("checkpoint directory " + directory + ": cannot list: " + errno_text());
  }
  std::vector<std::string> names;
  while (const dirent* entry = ::readdir(dir)) {
    if (is_checkpoint_file_name(entry->d_name)) names.emplace_back(entry->d_name);
  }
  ::closedir(dir);
  std::sort(names.begin(), names.end(), named_before);
  return names;
}

CheckpointScan scan_checkpoint_directory(const std::string& directory) {
  CheckpointScan scan;
  // One file in memory at a time besides the best so far: a full-width checkpoint is 45 MB.
  // Newest names first, so that the unreadable files are listed from the newest down.
  const auto names = checkpoint_file_names(directory);
  for (auto name = names.rbegin(); name != names.rend(); ++name) {
    const std::string path = directory + "/" + *name;
    try {
      auto checkpoint = read_checkpoint(path);
      if (!scan.newest || position(checkpoint) > position(scan.newest->second)) {
        scan.newest = std::make_pair(path, std::move(checkpoint));
      }
    } catch (const DataError& e) {
      scan.unreadable.emplace_back(path, e.what());
    }
  }
  return scan;
}

std::optional<std::pair<std::string, Checkpoint>> newest_valid_checkpoint(
    const std::string& directory, std::vector<std::string>* skipped) {
  auto scan = scan_checkpoint_directory(directory);
  if (skipped) {
    for (const auto& [path, why] : scan.unreadable) skipped->push_back(why);
  }
  return std::move(scan.newest);
}

CheckpointDirectoryLock::CheckpointDirectoryLock(const std::string& directory) {
  const std::string path = directory + "/" + kLockFileName;
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    throw DataError("checkpoint directory " + directory + ": cannot open its lock file " + path +
                    ": " + errno_text());
  }
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    char holder[256] = {0};
    const ssize_t n = ::pread(fd_, holder, sizeof holder - 1, 0);
    std::string who = n > 0 ? std::string(holder, static_cast<size_t>(n)) : "";
    while (!who.empty() && (who.back() == '\n' || who.back() == '\0')) who.pop_back();
    ::close(fd_);
    fd_ = -1;
    if (error != EWOULDBLOCK) {
      throw DataError("checkpoint directory " + directory + ": cannot lock " + path + ": " +
                      errno_text(error));
    }
    throw UsageError("--checkpoint-dir " + directory + " is in use by another dptrain run" +
                     (who.empty() ? std::string() : " (" + who + ")") +
                     "; wait for it to end, or give this run a directory of its own");
  }
  // Who holds it, for the message a second run prints. Best effort: the lock is the flock.
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  char started[32] = {0};
  if (::localtime_r(&now, &local) != nullptr) {
    std::strftime(started, sizeof started, "%Y-%m-%d %H:%M:%S", &local);
  }
  const std::string text =
      "pid " + std::to_string(::getpid()) + " on " + host_name() + ", since " + started + "\n";
  if (::ftruncate(fd_, 0) == 0) (void)!::pwrite(fd_, text.data(), text.size(), 0);
}

CheckpointDirectoryLock::~CheckpointDirectoryLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the flock
}

}  // namespace dptrain
