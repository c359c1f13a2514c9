// Hostile use of the messages: a path that holds a newline or an escape sequence reaches the
// one error line whole and inert.
// Not here: the other hostile classes (test_hostile*.cpp, test_binary_runs.cpp).
#include <gtest/gtest.h>

#include <string>

#include "support/cli_support.h"
#include "support/test_support.h"

namespace dptrain {
namespace {

using testing::contains;
using testing::expect_no_crash;
using testing::expect_one_error_line;
using testing::run_dptrain;
using testing::TempDir;
using testing::tiny_data_dir;

TEST(MessageLines, APathWithANewlineOrAnEscapeStaysOnOneInertLine) {
  TempDir dir;
  // A data directory that does not exist, named with a newline and the start of an escape
  // sequence (ESC [ 2 J clears a terminal): the path is the message's middle, not its end.
  const std::string data = dir.file("first\nsecond\x1b[2Jthird");
  auto result = run_dptrain({"train", "--data-dir", data, "--width", "4", "--epochs", "1"});
  expect_no_crash(result);
  expect_one_error_line(result, 1, "first\\nsecond\\x1b[2Jthird");
  EXPECT_FALSE(contains(result.err, "\x1b")) << result.err;

  // The same in a usage error, whose path is in the middle of the message.
  result = run_dptrain({"train", "--data-dir", tiny_data_dir(), "--width", "4", "--epochs", "1",
                        "--save-model", dir.file("no\nsuch/dir/m.safetensors")});
  expect_no_crash(result);
  expect_one_error_line(result, 2, "no\\nsuch/dir/m.safetensors");
}

TEST(MessageLines, Utf8NamesPassAsTheyAre) {
  TempDir dir;
  const std::string data = dir.file("donn\xc3\xa9" "es");  // "données", not a directory
  const auto result = run_dptrain({"train", "--data-dir", data, "--width", "4", "--epochs", "1"});
  expect_no_crash(result);
  expect_one_error_line(result, 1, "donn\xc3\xa9" "es");
}

}  // namespace
}  // namespace dptrain
