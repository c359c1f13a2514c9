// libFuzzer target for the command-line parser: the input, split at NUL bytes, is argv after
// "dptrain". Every command line must either parse or throw UsageError; another exception, a
// crash, a sanitizer report or a hang is a bug. What a good command line parses to is
// tests/app/test_cli.cpp's job.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "cli.h"
#include "dptrain/core/errors.h"

namespace {

// More arguments add nothing a fuzzer could find that fewer do not, only time per input.
constexpr size_t kMaxArguments = 64;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> arguments{"dptrain"};
  const char* const text = reinterpret_cast<const char*>(data);
  size_t start = 0;
  for (size_t i = 0; size > 0 && i <= size && arguments.size() <= kMaxArguments; ++i) {
    if (i == size || text[i] == '\0') {
      arguments.emplace_back(text + start, i - start);
      start = i + 1;
    }
  }
  std::vector<const char*> argv;
  for (const std::string& argument : arguments) argv.push_back(argument.c_str());
  argv.push_back(nullptr);  // argv[argc] is a null pointer, as main gets it
  try {
    dptrain::parse_command_line(static_cast<int>(arguments.size()), argv.data());
  } catch (const dptrain::UsageError&) {
    // The expected answer to a bad command line.
  }
  return 0;
}
