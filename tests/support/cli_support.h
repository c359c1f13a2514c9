// Helpers for the tests that run the dptrain binary (test_binary_runs.cpp, test_hostile.cpp): the
// one error line a failure must be, no crash, fake Fashion-MNIST files.
// Not here: running a child process itself (test_support.h).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "support/test_support.h"

namespace dptrain::testing {

std::vector<std::string> split_lines(const std::string& text);
bool contains(const std::string& text, const std::string& part);

// The dptrain binary followed by `args`: a command for spawn_command or run_command.
std::vector<std::string> binary_and(const std::vector<std::string>& args);
// Waits (up to 60 s) until the file at `path` holds `text`; false if it never does.
bool wait_for_text(const std::string& path, const std::string& text);

// The dptrain binary with `args`, killed after `timeout_seconds`.
CommandResult run_dptrain(const std::vector<std::string>& args,
                          const std::map<std::string, std::string>& env = {},
                          int timeout_seconds = 120);
// The exit status and both outputs, for failure messages.
std::string describe(const CommandResult& result);

// No abort, no uncaught exception, no C++ backtrace: whatever happened was handled.
void expect_no_crash(const CommandResult& result);
// The driver's exit statuses (app/main.cpp): a usage error, and an error while running.
constexpr int kUsage = 2;
constexpr int kRunTime = 1;
// Exit status `exit_code` and exactly one line on stderr: "error: ...<substring>...".
void expect_one_error_line(const CommandResult& result, int exit_code,
                           const std::string& substring);

// Fake Fashion-MNIST: `n` images of 28 x 28 bytes, labels i % 10, as IDX files.
std::vector<uint8_t> fake_images(uint32_t n);
std::vector<uint8_t> fake_labels(uint32_t n);
constexpr const char* kTrainImages = "train-images-idx3-ubyte";
constexpr const char* kTrainLabels = "train-labels-idx1-ubyte";
constexpr const char* kTestImages = "t10k-images-idx3-ubyte";
constexpr const char* kTestLabels = "t10k-labels-idx1-ubyte";
void write_fake_data(const TempDir& dir, uint32_t n_train, uint32_t n_test);
// A small valid data set (16 train, 8 test images) shared by the tests (removed at exit).
const std::string& tiny_data_dir();

}  // namespace dptrain::testing
