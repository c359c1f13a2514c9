// Helpers shared by the tests of every layer: temporary directories, files, hand-made IDX and
// gzip bytes, and running the dptrain binary (or torchrun) as a child process with a time limit.
// They use no dptrain layer but core's errors; the helpers that need a layer live in that layer's
// support file (data_support.h, parallel_support.h, train_support.h), so that each layer's test
// binary links that layer and the ones below, no more.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>


namespace dptrain::testing {

// A fresh directory under $TMPDIR, removed with everything in it on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes);

// A copy of the program at `program`, mode 0755, in a fresh directory that every user may enter
// (under the first of $TMPDIR, /tmp, /var/tmp and /dev/shm whose every ancestor is searchable by
// others), removed on destruction. A test that runs the binary as another user runs this copy:
// the build tree may lie where only its owner may enter (a clone under /root, a `mktemp -d`
// folder), which says nothing about the program. Throws std::runtime_error where no such
// directory exists or the copy fails: the test then fails, it does not skip.
class ProgramCopyForAnyUser {
 public:
  explicit ProgramCopyForAnyUser(const std::string& program);
  ~ProgramCopyForAnyUser();
  ProgramCopyForAnyUser(const ProgramCopyForAnyUser&) = delete;
  ProgramCopyForAnyUser& operator=(const ProgramCopyForAnyUser&) = delete;
  const std::string& path() const { return path_; }
  const std::string& directory() const { return directory_; }
  // The sanitizers' options of this process (ASAN_OPTIONS, LSAN_OPTIONS, UBSAN_OPTIONS) with
  // every suppressions file they name copied beside the program, for the child's environment: a
  // sanitized program that cannot read its suppressions file aborts before main.
  std::map<std::string, std::string> sanitizer_environment() const;

 private:
  std::string directory_;
  std::string path_;
};

// Whether a user who is neither the owner nor in the group of any component may reach `path`:
// every directory from / down to it (itself included) has the others' execute bit.
bool searchable_by_others(const std::string& path);

// Small file-system helpers on POSIX calls (Note [No std::filesystem] in lib/src/core/files.cpp).
bool path_exists(const std::string& path);
bool is_regular_file(const std::string& path);
int64_t file_size(const std::string& path);  // -1 when missing
void remove_path(const std::string& path);   // a file or an empty directory; missing is fine
void remove_tree(const std::string& path);   // a directory and everything in it
void make_directories(const std::string& path);
std::string current_directory();
void change_directory(const std::string& path);
std::vector<uint8_t> gzip_bytes(const std::vector<uint8_t>& bytes);
// A gzip stream of `head` followed by `zeros` zero bytes, made a piece at a time: a gzip bomb
// costs the test no memory (512 MiB of zeros pack into half a megabyte).
std::vector<uint8_t> gzip_then_zeros(const std::vector<uint8_t>& head, size_t zeros);

// An IDX file image: header (0, 0, type, dims.size(), big-endian dims) then `data` as given.
std::vector<uint8_t> make_idx(uint8_t type, const std::vector<uint32_t>& dims,
                              const std::vector<uint8_t>& data);

// Runs `action`, which must throw an E whose message contains every one of `phrases`; records a
// test failure otherwise (nothing thrown, another exception, a phrase missing). Returns the
// message, for further checks ("" when no E was thrown).
template <typename E>
std::string expect_throws(const std::function<void()>& action,
                          const std::vector<std::string>& phrases) {
  try {
    action();
    ADD_FAILURE() << "expected an exception, nothing was thrown";
  } catch (const E& error) {
    const std::string message = error.what();
    for (const auto& phrase : phrases) {
      EXPECT_NE(message.find(phrase), std::string::npos)
          << "the message lacks \"" << phrase << "\"; the message is: " << message;
    }
    return message;
  } catch (const std::exception& error) {
    ADD_FAILURE() << "expected another exception type, got: " << error.what();
  }
  return "";
}

// expect_throws<DataError>.
void expect_data_error(const std::function<void()>& action,
                       const std::vector<std::string>& phrases);

// The whole file as text ("" when it cannot be read).
std::string read_text(const std::string& path);
// The names in `directory` but . and .., sorted; empty when it cannot be listed.
std::vector<std::string> list_directory(const std::string& directory);
// The names in `directory` that end in ".tmp": what an interrupted or failed write would leave.
std::vector<std::string> temporary_files_in(const std::string& directory);

struct CommandResult {
  int exit_code = -1;  // the exit status; 128 + N when killed by signal N
  bool timed_out = false;
  std::string out;  // standard output
  std::string err;  // standard error
  // The bytes the child read through read(2) and its kin, its threads' included (rchar of
  // /proc/PID/io, taken before it is reaped); -1 where that file cannot be read. What proves a
  // file "refused unread": a sparse file reads fast, so wall time cannot.
  int64_t bytes_read = -1;
};

// For the EXPECT_EXIT or EXPECT_DEATH in its scope: the child is this test binary started afresh
// (a "threadsafe" death test) with `name`=`value` in its environment, so that what reads the
// environment as the process starts (LibTorch's OpenMP runtime reads OMP_NUM_THREADS) sees it, as
// in a user's process. Restores the style and the variable on destruction.
class FreshChildEnvironment {
 public:
  FreshChildEnvironment(const std::string& name, const std::string& value);
  ~FreshChildEnvironment();
  FreshChildEnvironment(const FreshChildEnvironment&) = delete;
  FreshChildEnvironment& operator=(const FreshChildEnvironment&) = delete;

 private:
  std::string name_;
  std::string style_;
  bool had_value_ = false;
  std::string old_value_;
};

// rchar of /proc/<pid>/io ("self" for this process): the bytes read so far; -1 where unreadable.
int64_t bytes_read_by(const std::string& pid);

// Whether every thread of process `pid` sleeps (state S or D in /proc/PID/task/*/stat) in two
// looks 50 ms apart, within `timeout_ms`: a process blocked in a wait, not one between steps or
// only descheduled (state R).
bool wait_until_blocked(int pid, int timeout_ms);
// The same for one thread of this process (its gettid()): a thread inside a wait.
bool wait_until_thread_blocked(int tid, int timeout_ms);

// What a child gets besides its arguments and environment, set between fork and exec.
struct ChildSetup {
  int64_t stack_limit_bytes = 0;      // RLIMIT_STACK (soft), which sizes the main thread's stack
  int64_t file_size_limit_bytes = 0;  // RLIMIT_FSIZE (soft), as `ulimit -f` sets it
  int run_as_uid = -1;                // switch to this user and group (needs root); -1: stay
  int run_as_gid = -1;
  std::string stdout_path;  // standard output into this file (e.g. /dev/full), not captured
  int64_t address_space_limit_bytes = 0;  // RLIMIT_AS (soft), as `ulimit -v` sets it
  std::vector<int> closed_descriptors;    // closed before exec (e.g. 1 for `>&-`)
};
// Exit status of a child whose ChildSetup could not be applied (e.g. no right to switch user).
constexpr int kChildSetupFailed = 126;

// Runs `args` (args[0] is the program path) with `extra_env` added to the environment, killing
// it after `timeout_seconds`.
CommandResult run_command(const std::vector<std::string>& args,
                          const std::map<std::string, std::string>& extra_env = {},
                          int timeout_seconds = 600, const ChildSetup& setup = {});

// The dptrain binary under test.
std::string dptrain_binary();

// A TCP port on 127.0.0.1 that was free a moment ago.
int free_port();

// A child process started in the background, its output going to files.
struct ChildProcess {
  int pid = -1;
  std::string out_path, err_path;
};
ChildProcess spawn_command(const std::vector<std::string>& args,
                           const std::map<std::string, std::string>& extra_env,
                           const std::string& log_prefix);
// Waits for the child, killing it after `timeout_seconds`; collects its output files.
CommandResult wait_command(const ChildProcess& child, int timeout_seconds);

}  // namespace dptrain::testing
