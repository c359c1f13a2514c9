// Preparing, locking and searching a checkpoint directory. See checkpoint_directory.h.
#include "dptrain/train/checkpoint_directory.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "dptrain/core/errors.h"
#include "dptrain/core/files.h"
#include "dptrain/train/accepted_model.h"
#include "dptrain/train/checkpoint.h"
#include "dptrain/train/checkpoint_types.h"
#include "dptrain/train/options.h"
#include "dptrain/train/recipe.h"

namespace dptrain {
namespace {

constexpr char kLockFileName[] = ".dptrain.lock";

// A checkpoint's name ends in ".safetensors" (format version 3) or ".dpt" (versions 1 and 2,
// which a run still resumes from and --fresh still removes).
constexpr const char* kCheckpointSuffixes[] = {".safetensors", ".dpt"};

bool ends_with(const std::string& name, const std::string& suffix) {
  return name.size() >= suffix.size() &&
         name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool is_checkpoint_file_name(const std::string& name) {
  const std::string prefix = "checkpoint-";
  for (const std::string suffix : kCheckpointSuffixes) {
    if (name.size() > prefix.size() + suffix.size() && name.rfind(prefix, 0) == 0 &&
        ends_with(name, suffix)) {
      return true;
    }
  }
  return false;
}

// A checkpoint's name without its suffix: "checkpoint-e0003-s000000".
std::string position_part(const std::string& name) {
  for (const std::string suffix : kCheckpointSuffixes) {
    if (ends_with(name, suffix)) return name.substr(0, name.size() - suffix.size());
  }
  return name;
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
  // access() says yes to root on sysfs and knows nothing of PATH_MAX: make what the first save
  // will make, a temporary beside the widest checkpoint name the flags allow (epochs and steps
  // are int32).
  constexpr long long kWidest = std::numeric_limits<int32_t>::max();
  std::string trial;
  if (const int error =
          try_create_beside(directory + "/" + checkpoint_file_name(kWidest, kWidest), &trial)) {
    throw DataError("checkpoint directory " + directory + ": cannot create a checkpoint there (" +
                    std::to_string(trial.size()) + "-byte trial path " + printable(trial) +
                    "): " + errno_text(error));
  }
}

std::string checkpoint_file_name(int64_t epochs_done, int64_t step_in_epoch) {
  char name[64];
  std::snprintf(name, sizeof name, "checkpoint-e%04lld-s%06lld.safetensors",
                static_cast<long long>(epochs_done), static_cast<long long>(step_in_epoch));
  return name;
}

bool named_before(const std::string& a, const std::string& b) {
  // The zero-padded names sort by position; wider numbers (epoch 10000 and up) sort by length.
  // At one position, an old ".dpt" file comes before the ".safetensors" one.
  const std::string pa = position_part(a), pb = position_part(b);
  if (pa != pb) return pa.size() != pb.size() ? pa.size() < pb.size() : pa < pb;
  return ends_with(a, ".dpt") && !ends_with(b, ".dpt");
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

CheckpointScan scan_checkpoint_directory(const std::string& directory,
                                         const AcceptedModel& accepted) {
  CheckpointScan scan;
  // One file in memory at a time besides the best so far: a full-width checkpoint is 45 MB.
  // Newest names first, so that the unreadable files are listed from the newest down.
  const auto names = checkpoint_file_names(directory);
  for (auto name = names.rbegin(); name != names.rend(); ++name) {
    const std::string path = directory + "/" + *name;
    try {
      auto checkpoint = read_checkpoint(path, "checkpoint", accepted);
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

namespace {

// "checkpoint-e0001-s000000.safetensors.1234-0.tmp": a temporary of write_file_atomically's for
// a checkpoint, and the pid of the process that wrote it (0 when `name` is no such temporary).
long temporary_writer(const std::string& name) {
  const std::string suffix = ".tmp";
  if (!ends_with(name, suffix)) return 0;
  size_t end = std::string::npos;  // where the checkpoint's own name ends
  for (const std::string checkpoint_suffix : kCheckpointSuffixes) {
    const size_t at = name.find(checkpoint_suffix + ".");
    if (at != std::string::npos && is_checkpoint_file_name(name.substr(0, at + checkpoint_suffix.size()))) {
      end = at + checkpoint_suffix.size();
      break;
    }
  }
  if (end == std::string::npos || end + 1 + suffix.size() > name.size()) return 0;
  const std::string tail = name.substr(end + 1, name.size() - suffix.size() - end - 1);
  const size_t dash = tail.find('-');
  if (dash == 0 || dash == std::string::npos || dash > 9) return 0;
  for (size_t i = 0; i < tail.size(); ++i) {
    if (i != dash && (tail[i] < '0' || tail[i] > '9')) return 0;
  }
  return std::stol(tail.substr(0, dash));
}

// Why the entry `path` may not be removed by --fresh, or nothing when it may: a regular file
// of this user's, one name only, that says it is a dptrain checkpoint (is_checkpoint_file).
std::optional<std::string> why_not_removable(const std::string& path) {
  struct stat info {};
  if (::lstat(path.c_str(), &info) != 0) return "cannot look at it: " + errno_text();
  if (!S_ISREG(info.st_mode)) return "it is " + file_kind(info.st_mode);
  if (info.st_uid != ::geteuid()) {
    return "it belongs to user " + std::to_string(info.st_uid) + ", not to this one";
  }
  if (info.st_nlink != 1) return "it has " + std::to_string(info.st_nlink) + " hard links";
  try {
    const RegularFile file(path, "");
    if (!is_checkpoint_file(file)) {
      return std::string("it is not a dptrain checkpoint (neither a safetensors file whose "
                         "metadata says \"dptrain.kind\": \"checkpoint\" nor a DPTRNCKP file)");
    }
  } catch (const DataError& e) {
    return std::string(e.what());
  }
  return std::nullopt;
}

}  // namespace

std::vector<std::string> remove_checkpoints_for_fresh_start(const std::string& directory) {
  // Everything is checked before anything is removed: --fresh removes all of the checkpoints or
  // none, and never a file that is not one (a text file, another user's, a link) that merely
  // carries the name.
  const auto names = checkpoint_file_names(directory);
  std::string refused;
  size_t refused_count = 0;
  for (const auto& name : names) {
    const std::string path = directory + "/" + name;
    if (const auto why = why_not_removable(path)) {
      if (refused_count++ == 0) refused = path + ": " + *why;
    }
  }
  if (refused_count > 0) {
    throw UsageError("--fresh: " + printable(refused) +
                     (refused_count > 1 ? " (and " + std::to_string(refused_count - 1) +
                                              " more such file(s))"
                                        : "") +
                     "; --fresh removes only dptrain checkpoints of this user's, and this run "
                     "would later write under such names; nothing was removed: move it away");
  }
  std::vector<std::string> removed;
  for (const auto& name : names) {
    const std::string path = directory + "/" + name;
    if (::unlink(path.c_str()) != 0) {
      throw DataError("--fresh: cannot remove " + path + ": " + errno_text() + " (removed " +
                      std::to_string(removed.size()) + " of " + std::to_string(names.size()) +
                      " before it)");
    }
    removed.push_back(path);
  }
  sync_directory(directory);
  return removed;
}

std::vector<std::string> remove_stale_temporaries(const std::string& directory) {
  DIR* dir = ::opendir(directory.c_str());
  if (dir == nullptr) return {};
  std::vector<std::string> names;
  while (const dirent* entry = ::readdir(dir)) names.emplace_back(entry->d_name);
  ::closedir(dir);
  std::vector<std::string> removed;
  for (const auto& name : names) {
    const long pid = temporary_writer(name);
    // The writer is gone: not this process, and no process of that pid on this host (the
    // directory's lock, held by the caller, keeps every other run out).
    if (pid <= 0 || pid == ::getpid() || ::kill(static_cast<pid_t>(pid), 0) == 0 ||
        errno != ESRCH) {
      continue;
    }
    const std::string path = directory + "/" + name;
    struct stat info {};
    if (::lstat(path.c_str(), &info) != 0 || !S_ISREG(info.st_mode) ||
        info.st_uid != ::geteuid() || info.st_nlink != 1) {
      continue;
    }
    if (::unlink(path.c_str()) == 0) removed.push_back(path);
  }
  return removed;
}

void check_outputs_apart_from_checkpoints(const std::string& directory,
                                          const std::vector<RoleFile>& outputs) {
  // What is there now: a hard link to a checkpoint is found by its inode.
  std::vector<RoleFile> own{{"--checkpoint-dir's lock file", directory + "/" + kLockFileName}};
  if (DIR* dir = ::opendir(directory.c_str())) {
    while (const dirent* entry = ::readdir(dir)) {
      const std::string name = entry->d_name;
      if (is_checkpoint_file_name(name) || temporary_writer(name) != 0) {
        own.push_back({"--checkpoint-dir's checkpoint", directory + "/" + name});
      }
    }
    ::closedir(dir);
  }
  check_distinct_files(outputs, own);
  // What the run will write there later, under names of these forms.
  const std::string here = file_identity(directory).real_path;
  for (const auto& output : outputs) {
    const std::string path = file_identity(output.path).real_path;
    const size_t slash = path.rfind('/');
    if (slash == std::string::npos || path.substr(0, slash == 0 ? 1 : slash) != here) continue;
    const std::string name = path.substr(slash + 1);
    if (is_checkpoint_file_name(name) || temporary_writer(name) != 0) {
      throw UsageError(output.role + " and --checkpoint-dir's checkpoints name one file, " +
                       printable(path) + "; the run saves its checkpoints under such names: " +
                       "give it another name");
    }
  }
}

CheckpointDirectoryLock::CheckpointDirectoryLock(const std::string& directory) {
  try {
    lock_ = std::make_unique<HolderLock>(directory + "/" + kLockFileName,
                                         "checkpoint directory " + directory,
                                         /*remove_when_done=*/false);
  } catch (const HolderLock::Held& held) {
    throw UsageError("--checkpoint-dir " + directory + " is in use by another dptrain run" +
                     (held.holder().empty() ? std::string() : " (" + held.holder() + ")") +
                     "; wait for it to end, or give this run a directory of its own");
  }
}

// ---- Where a run starts -------------------------------------------------------------------------

// Note [What a checkpoint directory may hold]
// A run never writes over a checkpoint it did not read. Without --resume, a directory that already
// holds checkpoints is refused (they would be overwritten) unless --fresh removes them first.
// With --resume, every file is read and the latest position stored inside wins, whatever the
// names say; a file that cannot be read is named with the reason, and is refused when nothing
// else can be read or when the run would later save under its name. One process writes: the one
// that holds global rank 0, under the directory's lock (checkpoint_directory.h).
std::optional<std::pair<std::string, Checkpoint>> choose_start(const TrainOptions& options,
                                                               bool writer,
                                                               const Notice& on_notice) {
  if (!options.checkpoint_dir) return std::nullopt;
  const std::string& directory = *options.checkpoint_dir;
  // Names found in the directory are another program's bytes, maybe: every message shows them
  // through printable(), so that a name holding escape sequences never drives the terminal.
  const auto notice = [&](const std::string& text) {
    if (writer && on_notice) on_notice(printable(text));
  };
  const std::string fresh_hint =
      "move it away, or pass --fresh to start over (which removes the directory's checkpoints)";
  if (writer && (options.fresh || options.resume)) {
    for (const auto& path : remove_stale_temporaries(directory)) {
      notice("removed " + path + ", left by a writer that was killed during a write");
    }
  }
  if (options.fresh) {
    if (!writer) return std::nullopt;
    for (const auto& path : remove_checkpoints_for_fresh_start(directory)) {
      notice("--fresh: removed " + path);
    }
    return std::nullopt;
  }
  if (!options.resume) {
    const auto names = checkpoint_file_names(directory);
    if (!writer || names.empty()) return std::nullopt;
    throw UsageError("--checkpoint-dir " + directory + " already holds " +
                     std::to_string(names.size()) + " checkpoint(s) (" + printable(names.back()) +
                     (names.size() > 1 ? " and others" : "") +
                     ") that this run would overwrite; pass --resume to continue from the "
                     "newest, or --fresh to start over (which removes them)");
  }
  auto scan = scan_checkpoint_directory(directory, accepted_run_model(options.width));
  const std::string start_name = scan.newest
                                     ? directory + "/" +
                                           checkpoint_file_name(scan.newest->second.epochs_done,
                                                                scan.newest->second.step_in_epoch)
                                     : "";
  for (const auto& [path, why] : scan.unreadable) {
    if (!scan.newest) {
      throw UsageError("--resume: no checkpoint in " + directory + " can be read (" +
                       printable(why) +
                       (scan.unreadable.size() > 1
                            ? "; and " + std::to_string(scan.unreadable.size() - 1) + " more"
                            : "") +
                       "); " + fresh_hint);
    }
    if (named_before(start_name, path)) {
      throw UsageError("--resume: " + printable(why) + "; this run resumes from " +
                       printable(scan.newest->first) +
                       " and would later save under that name; " + fresh_hint);
    }
    notice("--resume: skipped " + why);
  }
  // From here on the path is only shown (check_resumable, "resuming from"), never opened.
  if (scan.newest) scan.newest->first = printable(scan.newest->first);
  return std::move(scan.newest);
}

void check_resumable(const Checkpoint& checkpoint, const std::string& path,
                     const CheckpointConfig& run, const Notice& on_notice) {
  check_checkpoint_matches(checkpoint.config, run, path);
  const auto differ = [&](const char* flag, const std::string& was, const std::string& is) {
    if (was != is) {
      throw UsageError("--resume: checkpoint " + path + " was written with " + flag + " " + was +
                       ", this run has " + is + "; the data order would not continue");
    }
  };
  differ("--batch-size", std::to_string(checkpoint.config.batch_size),
         std::to_string(run.batch_size));
  differ("--seed", std::to_string(checkpoint.config.seed), std::to_string(run.seed));
  differ("a training set of", std::to_string(checkpoint.config.train_size),
         std::to_string(run.train_size));
  // The momentum buffers, the averaged weights and the schedule's position belong to the recipe
  // that wrote them; with another, the resumed run would train neither the one nor the other.
  const std::string saved_recipe = recipe_flags(checkpoint.config.recipe);
  const std::string run_recipe = recipe_flags(run.recipe);
  if (saved_recipe != run_recipe) {
    throw UsageError("--resume: checkpoint " + path + " was written with " + saved_recipe +
                     ", this run has " + run_recipe +
                     "; a resume continues the recipe it was written with: give the same flags");
  }
  if (checkpoint.config.schedule_epochs != run.schedule_epochs) {
    throw UsageError("--resume: checkpoint " + path + " was written with --epochs " +
                     std::to_string(checkpoint.config.schedule_epochs) +
                     ", this run has --epochs " + std::to_string(run.schedule_epochs) +
                     "; its learning-rate schedule spans the epochs: give the same --epochs");
  }
  // Note [Resuming on another world size]
  // The data order and each global batch depend on --seed and --batch-size only, so a run may
  // continue on another number of ranks. What changes is how a global batch is split: without
  // --sync-bn each replica normalises its own share, so the steps are not those the writing
  // world would have taken; with it they are the same to rounding (the sums are ordered
  // differently). tests/integration/test_resume.cpp measures both.
  if (checkpoint.config.world_size != run.world_size && on_notice) {
    on_notice("--resume: " + path + " was written by " +
                        std::to_string(checkpoint.config.world_size) + " rank(s), this run has " +
                        std::to_string(run.world_size) +
                        ": the same global batches, split over the new world");
  }
  if (checkpoint.format_version < kCheckpointFormatVersion && on_notice) {
    on_notice("--resume: " + path + " is of format version " +
              std::to_string(checkpoint.format_version) + " (DPTRNCKP), read; this run writes " +
              "version " + std::to_string(kCheckpointFormatVersion) + " (.safetensors) beside it");
  }
  if (checkpoint.config.train_digest.empty()) {
    if (on_notice) {
      on_notice("--resume: " + path +
                          " is of format version 1, which holds no digest of its training set; "
                          "only the set's size is compared");
    }
    return;
  }
  differ("the training set of SHA-256", printable(checkpoint.config.train_digest),
         run.train_digest);
}

}  // namespace dptrain
