// The checkpoint directory of a run: created and checked before training, locked against a second
// run, its files named by position and searched for the newest one by what they hold, and the
// resume policy: which checkpoint a run starts from, and whether it may.
// Not here: the file format (checkpoint.h) or when to save (RankTraining, rank.cpp).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dptrain/core/files.h"
#include "dptrain/train/accepted_model.h"
#include "dptrain/train/checkpoint_types.h"

namespace dptrain {

// Creates `directory` (and its parents) if missing and checks that it can be written, so that a
// bad --checkpoint-dir fails before training rather than after the first epoch: a trial file
// named like the longest checkpoint temporary a run can write there is created and removed, so
// that a path too long for it (PATH_MAX) or a place that takes no files (sysfs, procfs) fails
// now. DataError.
void prepare_checkpoint_directory(const std::string& directory);

// Refuses (UsageError, Note [One file, two roles] in files.h) an output in `outputs` that is one
// of `directory`'s own files: its lock file, a checkpoint or a checkpoint's temporary, whether it
// is there now (by name or by inode) or is a name of that form that the run would write.
void check_outputs_apart_from_checkpoints(const std::string& directory,
                                          const std::vector<RoleFile>& outputs);

// "checkpoint-e0003-s000000.dpt": the position a file was written at, for people; the search
// below goes by the position stored inside, never by the name.
std::string checkpoint_file_name(int64_t epochs_done, int64_t step_in_epoch);

// Whether checkpoint file name `a` names an earlier position than `b` (or paths to them in one
// directory): the order of checkpoint_file_name's names, wider numbers last.
bool named_before(const std::string& a, const std::string& b);

// The names of the checkpoint files ("checkpoint-*.dpt") in `directory`, without reading them,
// in the order of the positions they name; none when the directory does not exist. DataError
// when it cannot be listed.
std::vector<std::string> checkpoint_file_names(const std::string& directory);

// What a directory of checkpoints holds, every file read.
struct CheckpointScan {
  // The checkpoint at the latest position (epochs, step, global step) stored inside, with its
  // path; a name that claims another position does not count.
  std::optional<std::pair<std::string, Checkpoint>> newest;
  // Each file that could not be read, newest name first: its path and why (corrupt, truncated,
  // not a regular file, a newer format, ...).
  std::vector<std::pair<std::string, std::string>> unreadable;
};
// Each file is read as `accepted` allows (checkpoint.h): a --resume passes its own model, so a
// file claiming another is named unreadable before its data is read.
CheckpointScan scan_checkpoint_directory(
    const std::string& directory, const AcceptedModel& accepted = accepted_in_memory(false));

// scan_checkpoint_directory's newest; `skipped`, when given, receives one line per unreadable
// file ("checkpoint F: corrupt: ...").
std::optional<std::pair<std::string, Checkpoint>> newest_valid_checkpoint(
    const std::string& directory, std::vector<std::string>* skipped);

// --fresh: removes every checkpoint file of `directory` and returns their paths, or removes
// nothing and throws UsageError naming the first entry that is not a dptrain checkpoint of this
// user's (a text file of that name, another user's file, a link, a FIFO). DataError when a
// removal fails after all were checked (it says how many went before).
std::vector<std::string> remove_checkpoints_for_fresh_start(const std::string& directory);

// Removes the temporary files ("checkpoint-*.dpt.<pid>-<n>.tmp") that writers killed during a
// write left in `directory` (their pid no longer runs here); returns their paths. Only under
// the directory's lock.
std::vector<std::string> remove_stale_temporaries(const std::string& directory);

// Note [One run per checkpoint directory]
// Two runs writing into one directory would replace each other's checkpoints, and a resume would
// then mix them. The process that holds global rank 0 (the only writer) holds a HolderLock
// (files.h) on `<directory>/.dptrain.lock` for the whole run. The file stays when the run ends:
// the directory is the run's, and its lock file is the name --fresh and the output checks know.
class CheckpointDirectoryLock {
 public:
  // Throws UsageError naming the holder ("pid 1234 on host h") when another run holds the lock.
  explicit CheckpointDirectoryLock(const std::string& directory);

 private:
  std::unique_ptr<HolderLock> lock_;
};

struct TrainOptions;

// Says something the user should know that is no error (TrainCallbacks::on_notice); may be null.
using Notice = std::function<void(const std::string& text)>;

// Where a run starts under --checkpoint-dir, --resume and --fresh (Note [What a checkpoint
// directory may hold] in checkpoint_directory.cpp): nullopt for the beginning, else the newest
// readable checkpoint and its path (for messages only: printable(), as a name found on disk may
// hold escape sequences). Each file is read as the run's own model (accepted_run_model): one
// claiming another width is named unreadable before its data is read. `writer`: this process holds global rank 0 and the
// directory's lock, and alone removes files and reports through `on_notice`. UsageError when the
// run would overwrite or skip what it must not.
std::optional<std::pair<std::string, Checkpoint>> choose_start(const TrainOptions& options,
                                                               bool writer,
                                                               const Notice& on_notice);

// Whether a resumed run, whose checkpoint record is `run` (checkpoint_config), continues the data
// order and model of `checkpoint`, read from `path`: UsageError if not. Tells `on_notice` of a
// new world size and of a version 1 file, whose training set is compared by size only.
void check_resumable(const Checkpoint& checkpoint, const std::string& path,
                     const CheckpointConfig& run, const Notice& on_notice);

}  // namespace dptrain
