// Helpers for the tests that run the dptrain binary. See cli_support.h.
#include "support/cli_support.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <thread>

namespace dptrain::testing {

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  size_t begin = 0;
  while (begin < text.size()) {
    const size_t end = text.find('\n', begin);
    if (end == std::string::npos) {
      lines.push_back(text.substr(begin));
      break;
    }
    lines.push_back(text.substr(begin, end - begin));
    begin = end + 1;
  }
  return lines;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

std::vector<std::string> binary_and(const std::vector<std::string>& args) {
  std::vector<std::string> command{dptrain_binary()};
  command.insert(command.end(), args.begin(), args.end());
  return command;
}

bool wait_for_text(const std::string& path, const std::string& text) {
  for (int i = 0; i < 3000; ++i) {
    if (contains(read_text(path), text)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

CommandResult run_dptrain(const std::vector<std::string>& args,
                          const std::map<std::string, std::string>& env, int timeout_seconds) {
  return run_command(binary_and(args), env, timeout_seconds);
}

std::string describe(const CommandResult& result) {
  return "exit " + std::to_string(result.exit_code) + (result.timed_out ? " (timed out)" : "") +
         "\n--- stdout ---\n" + result.out + "--- stderr ---\n" + result.err;
}

// No abort, no uncaught exception, no C++ backtrace: whatever happened was handled.
void expect_no_crash(const CommandResult& result) {
  EXPECT_FALSE(result.timed_out) << describe(result);
  EXPECT_GE(result.exit_code, 0) << describe(result);
  EXPECT_LT(result.exit_code, 128) << "killed by a signal\n" << describe(result);
  for (const char* marker : {"terminate called", "Exception raised from"}) {
    EXPECT_FALSE(contains(result.out, marker)) << describe(result);
    EXPECT_FALSE(contains(result.err, marker)) << describe(result);
  }
}

// Exit status `exit_code` and exactly one line on stderr: "error: ...<substring>...".
void expect_one_error_line(const CommandResult& result, int exit_code,
                           const std::string& substring) {
  expect_no_crash(result);
  EXPECT_EQ(result.exit_code, exit_code) << describe(result);
  const auto lines = split_lines(result.err);
  ASSERT_EQ(lines.size(), 1u) << "stderr is not one line\n" << describe(result);
  EXPECT_EQ(lines[0].rfind("error: ", 0), 0u) << describe(result);
  EXPECT_TRUE(contains(lines[0], substring))
      << "expected the error to mention '" << substring << "'\n"
      << describe(result);
  EXPECT_FALSE(contains(result.out, "epoch ")) << describe(result);
}

// Fake Fashion-MNIST: `n_train` / `n_test` images of 28 x 28 bytes, labels i % 10.
std::vector<uint8_t> fake_images(uint32_t n) {
  std::vector<uint8_t> pixels(static_cast<size_t>(n) * 28 * 28);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<uint8_t>((i * 37) % 256);
  return make_idx(0x08, {n, 28, 28}, pixels);
}

std::vector<uint8_t> fake_labels(uint32_t n) {
  std::vector<uint8_t> labels(n);
  for (uint32_t i = 0; i < n; ++i) labels[i] = static_cast<uint8_t>(i % 10);
  return make_idx(0x08, {n}, labels);
}

void write_fake_data(const TempDir& dir, uint32_t n_train, uint32_t n_test) {
  write_bytes(dir.file(kTrainImages), fake_images(n_train));
  write_bytes(dir.file(kTrainLabels), fake_labels(n_train));
  write_bytes(dir.file(kTestImages), fake_images(n_test));
  write_bytes(dir.file(kTestLabels), fake_labels(n_test));
}

// A small valid data set shared by the tests that need one (removed at exit).
const std::string& tiny_data_dir() {
  static const TempDir dir;
  static const bool written = (write_fake_data(dir, 16, 8), true);
  (void)written;
  return dir.path();
}

}  // namespace dptrain::testing
