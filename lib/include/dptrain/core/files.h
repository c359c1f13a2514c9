// Files, the POSIX way, in one place: whole-file reads that refuse anything but a regular file,
// mkdir -p, output paths checked before a run, writes that land whole or not at all, and
// directory syncs. Not std::filesystem: PyPI's libtorch.so exports its own copy of those symbols,
// which then stand in for ours and crash (Note [No std::filesystem] in files.cpp).
// Not here: what the files hold (checkpoint.h, plot.h, metrics.h, download.h, idx.h).
#pragma once

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace dptrain {

// strerror's text for `error` (errno by default, read when the call is made).
std::string errno_text(int error = errno);

// The directory part of `path`: "." for a bare name, "/" for a file in the root.
std::string parent_directory(const std::string& path);

// What a path names, for messages: "a FIFO", "a directory", "a character device", ...
// `mode` is a stat st_mode.
std::string file_kind(unsigned mode);

// mkdir -p. Throws DataError "<what>: cannot create P: <reason>", or "<what>: P is not a
// directory". EEXIST is fine: another rank may be creating the same directory.
void make_directories(const std::string& directory, const std::string& what);

// A regular file open for reading, read piece by piece where it stands, so that a reader can
// check a header before it reads (or allocates for) what the header declares. Anything but a
// regular file (a FIFO, a device, a directory) is a DataError "<what> PATH: not a regular file
// (a FIFO)" at once (without `what`: "PATH: ..."): the file is opened without blocking, so a
// FIFO with no writer cannot hang the reader.
class RegularFile {
 public:
  RegularFile(const std::string& path, const std::string& what);
  ~RegularFile();
  RegularFile(const RegularFile&) = delete;
  RegularFile& operator=(const RegularFile&) = delete;

  uint64_t size() const { return size_; }  // as fstat saw it when opened
  const std::string& name() const { return name_; }  // "<what> PATH", for messages
  // Reads exactly `size` bytes at `offset`; a DataError if the file ends first (it shrank).
  void read_at(uint64_t offset, void* out, size_t size) const;

 private:
  int fd_ = -1;
  uint64_t size_ = 0;
  std::string name_;
};

// The whole of a regular file (RegularFile's refusals), refused unread when it is larger than
// `max_bytes`: "<what> PATH: N bytes, more than <limit_reason>".
std::vector<uint8_t> read_regular_file(const std::string& path, const std::string& what,
                                       uint64_t max_bytes = UINT64_MAX,
                                       const std::string& limit_reason = "");

// Note [Untrusted text in messages]
// A message can carry text dptrain did not write: a path typed on the command line, a name or
// value read from a file, another process's line in a lock file, an environment variable. Such
// text must not drive the terminal (an escape sequence), split the message's one line (a
// newline), or hide what it holds. One policy, in two steps, both here:
// - Every line dptrain prints to the terminal about its work (the error line, a notice, a lost
//   record, a download's failure) leaves through message_line: each control byte (below 0x20,
//   and DEL) as \xNN, a newline as \n; every other byte passes, so a UTF-8 name reads as the user
//   typed it, and text already through printable passes unchanged (a backslash stays one).
// - Bytes that come from a file, another program or the environment and that a message quotes
//   (a tensor name, a digest, a lock holder, OMP_NUM_THREADS) go through printable where they
//   are quoted: only printable ASCII passes, every other byte as \xNN and a backslash as \\, so
//   that the bytes can be told apart exactly (invalid UTF-8, a look-alike letter, a control
//   byte) and scripts/read_checkpoint.py quotes a file's bytes the same way.
// printable's output is printable ASCII, which message_line leaves as it is: a quoted name is
// escaped once, whichever step saw it first.

// `text` with every byte that is not printable ASCII written as \xNN (and a backslash as \\):
// bytes from a file or another program that a message quotes (Note [Untrusted text in messages]).
std::string printable(const std::string& text);

// `text` as one inert line for the terminal: control bytes as \xNN, a newline as \n, all else as
// it is (Note [Untrusted text in messages]).
std::string message_line(const std::string& text);

// Whether a new file can be created beside `path` now: the one probe every output takes before
// the training (check_output_file, the checkpoint directory, --tensorboard's directory), so that
// a read-only place or a name too long fails then rather than after the first epoch. It creates
// the temporary file write_file_atomically would create beside `path`, in the widest form of its
// name (the largest counter), exclusively and never through a symbolic link, and removes it at
// once. Returns 0, or the errno of the failed creation; `trial`, when given, gets the path tried.
int try_create_beside(const std::string& path, std::string* trial = nullptr);

// Checks, before a run, that `path` can later be written by write_file_atomically: it is a new
// name or a regular file (never a device, FIFO, directory or symbolic link), and its directory
// exists and takes a new file (try_create_beside). Throws UsageError "<flag> PATH: ..." naming
// what is wrong.
void check_output_file(const std::string& path, const std::string& flag);

// Note [One file, two roles]
// A path checked on its own can still be another role's file: --save-model onto --metrics, onto a
// data file, onto the checkpoint directory's lock file (whose next holder then writes its line
// into the saved model). Two names are one file when they lead to one place: the real path of
// the directory plus the last name (a link to a directory, "..", "./" all resolve; the file need
// not exist yet), or, for files that exist, one device and inode (a hard link, or a symbolic
// link among the inputs). Checked once, before anything is read, for every output against every
// other output and every input; inputs may share a file with each other.

// Where `path` leads: its real path when it exists, else its directory's real path plus its last
// name (its own text when even the directory cannot be resolved), and its device and inode when
// it exists.
struct FileIdentity {
  std::string real_path;
  bool exists = false;
  uint64_t device = 0;
  uint64_t inode = 0;
};
FileIdentity file_identity(const std::string& path);
bool same_file(const FileIdentity& a, const FileIdentity& b);

// A file a run reads or writes, and the flag it came from, for the message: {"--metrics",
// "m.csv"}, or {"--checkpoint-dir's lock file", "ck/.dptrain.lock"}.
struct RoleFile {
  std::string role;
  std::string path;
};

// Throws UsageError "<role a> and <role b> are one file, <real path>; ..." for the first output
// that is another output or an input (Note [One file, two roles]).
void check_distinct_files(const std::vector<RoleFile>& outputs,
                          const std::vector<RoleFile>& inputs);

// Note [Lock files that name their holder]
// Every exclusive hold dptrain takes on a place — a checkpoint directory (one run), an output
// (one writer), a download directory (one download) — is one protocol, HolderLock: an
// exclusive, non-blocking flock(2) on a lock file, which the kernel drops however the process
// ends (a crash leaves no stale lock), and a line in the file saying who holds it (pid, host,
// since when) for the refusal a second process prints. The file is opened with O_NOFOLLOW and
// must be a regular file with one link: a hard link planted there would have another file
// truncated and overwritten with that line. A holder may remove the file when it is done; a
// taker therefore checks, once it holds the flock, that the name still leads to the file it
// locked, and starts again if not.
class HolderLock {
 public:
  // The refusal when another process holds the lock: what its lock file says, printable.
  class Held : public std::runtime_error {
   public:
    explicit Held(std::string holder)
        : std::runtime_error("held by another process"), holder_(std::move(holder)) {}
    const std::string& holder() const { return holder_; }

   private:
    std::string holder_;
  };

  // Takes `lock_path`; `what` begins every message ("checkpoint directory D", "--metrics F").
  // Throws Held when another process holds it, DataError when the file cannot be made a lock.
  // `remove_when_done`: the file goes when the hold ends (an output's directory keeps no trace).
  HolderLock(std::string lock_path, const std::string& what, bool remove_when_done);
  ~HolderLock();
  HolderLock(const HolderLock&) = delete;
  HolderLock& operator=(const HolderLock&) = delete;

 private:
  std::string lock_path_;
  bool remove_when_done_;
  int fd_ = -1;
};

// Note [One writer per output]
// Two runs given one --metrics (or --plot, --save-model, --logits) would both exit 0 with their
// records interleaved, or the last one's file in place. The output cannot be locked itself: the
// atomic writers replace its inode at every write, and the metrics file is truncated when it is
// opened. So the writer holds a HolderLock on a sibling, "<dir>/.<name>.lock", from before the
// data is read to its end, and removes it when done. An output that is a directory (--tensorboard
// DIR, whose runs are folders in it) holds "DIR/.dptrain-writer.lock" instead, inside it: every
// spelling of DIR (a trailing slash, a symbolic link to it, "x/..") then meets the one lock file,
// where a sibling's name would follow the spelling.
enum class OutputKind { kFile, kDirectory };

class OutputLock {
 public:
  // Throws UsageError "<flag> PATH is being written by another dptrain run (pid N on host H,
  // since ...)" when another process holds it; DataError when the lock file cannot be made.
  // A kDirectory output must exist.
  OutputLock(const std::string& path, const std::string& flag,
             OutputKind kind = OutputKind::kFile);

  // "<dir>/.<name>.lock": the lock file of output `path`.
  static std::string lock_path(const std::string& path);
  // "DIR/.dptrain-writer.lock": the lock file of a directory output.
  static std::string directory_lock_path(const std::string& directory);

 private:
  std::unique_ptr<HolderLock> lock_;
};

// fsync of a directory, so that a file created or renamed in it keeps its name after a crash.
// Best effort: some file systems refuse to open or sync a directory, which is harmless here.
void sync_directory(const std::string& directory);
void sync_parent_directory(const std::string& path);  // the directory holding `path`

// write(2) until all `size` bytes are written, again after an interruption (EINTR). Returns 0,
// or the errno of the failed write (ENOSPC where the device took no byte). With SIGXFSZ ignored
// (signals.h), a write past RLIMIT_FSIZE fails with EFBIG.
int write_all(int fd, const void* data, size_t size);

// Writes `size` bytes to `path` through a temporary file of a name of its own in the same
// directory (created exclusively, never through a symbolic link): write, fsync, close, rename,
// then sync the directory. Only a regular file (or nothing) at `path` is replaced. On failure
// the temporary file is removed, whatever stood at `path` is untouched, and a DataError says
// "<what>: cannot <step>: <reason><note>".
void write_file_atomically(const std::string& path, const void* data, size_t size,
                           const std::string& what, const std::string& note = "");

}  // namespace dptrain
