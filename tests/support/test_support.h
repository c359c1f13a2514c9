// Helpers shared by the tests: temporary directories, hand-made IDX files, the real data set,
// and running the dptrain binary (or torchrun) as a child process with a time limit.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "dptrain/data/data.h"
#include "dptrain/model/model.h"
#include "dptrain/parallel/distributed.h"
#include "dptrain/train/train.h"

namespace dptrain::testing {

// The tests' train() and evaluate_weights(): the world checked (check_world), then the run, as
// the driver does; on_step is the per-step callback, which makes the host wait every step.
TrainResult train(const FashionMnist& data, const TrainOptions& options, const WorldPlan& world,
                  const TrainCallbacks& callbacks);
TrainResult train(const FashionMnist& data, const TrainOptions& options, const WorldPlan& world,
                  const EpochCallback& on_epoch = nullptr, const StepCallback& on_step = nullptr);
EvalResult evaluate_weights(const FashionMnist& data, const TrainOptions& options,
                            const WorldPlan& world,
                            const std::vector<std::pair<std::string, torch::Tensor>>& weights,
                            const std::string& name = "in memory");

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

// `train` and `test` random images and labels from a fixed seed: enough to compare runs with
// each other, no files needed.
FashionMnist synthetic_data(int64_t train, int64_t test);
// `replicas` CPU replicas, threads of this process.
WorldPlan cpu_world(int replicas);

// Where the real Fashion-MNIST is (resolve_data_dir without a flag), or nullopt.
std::optional<std::string> real_data_dir();

// Loads a --save-model file (the checkpoint format) into `model`, which must have its width.
void load_model_file(ResNet& model, const std::string& path);

struct CommandResult {
  int exit_code = -1;  // the exit status; 128 + N when killed by signal N
  bool timed_out = false;
  std::string out;  // standard output
  std::string err;  // standard error
};

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

// Runs fn(communicator) on `world_size` threads, each one rank of a Gloo world over loopback
// with the given timeout. Rethrows the first failure after all threads have ended.
void run_thread_ranks(int world_size, const std::function<void(Communicator&)>& fn,
                      std::chrono::milliseconds timeout = std::chrono::seconds(60));

}  // namespace dptrain::testing
