// libFuzzer target for the IDX reader: any bytes must either parse into a consistent array or
// throw DataError. Another exception, a crash, a sanitizer report or a hang is a bug.
// Input that starts with the gzip magic goes through read_idx_file (via an in-memory file), so
// that the gunzip path is fuzzed too; what a good file parses to is tests/data/test_idx.cpp's job.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "dptrain/data/idx.h"
#include "dptrain/core/errors.h"

namespace {

// An anonymous in-memory file, made once, that read_idx_file can open by its /proc path.
struct MemoryFile {
  int fd = -1;
  std::string path;
};

const MemoryFile& memory_file() {
  static const MemoryFile file = [] {
    MemoryFile made;
    made.fd = memfd_create("fuzz_idx", 0);
    if (made.fd < 0) {
      std::perror("fuzz_idx: memfd_create");
      std::abort();
    }
    made.path = "/proc/self/fd/" + std::to_string(made.fd);
    return made;
  }();
  return file;
}

dptrain::IdxArray read_through_file(const uint8_t* data, size_t size) {
  const MemoryFile& file = memory_file();
  if (ftruncate(file.fd, 0) != 0 || pwrite(file.fd, data, size, 0) != static_cast<ssize_t>(size)) {
    std::perror("fuzz_idx: writing the in-memory file");
    std::abort();
  }
  return dptrain::read_idx_file(file.path);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const bool gzip = size >= 2 && data[0] == 0x1f && data[1] == 0x8b;
  try {
    const dptrain::IdxArray array = gzip ? read_through_file(data, size)
                                         : dptrain::parse_idx({data, data + size}, "fuzz input");
    // A parse that succeeds must agree with its own header: the product of the sizes, computed
    // without wrapping around, is the number of bytes.
    uint64_t elements = 1;
    bool wrapped = false;
    for (const int64_t dim : array.dims) {
      wrapped |= dim < 0 || __builtin_mul_overflow(elements, static_cast<uint64_t>(dim), &elements);
    }
    if (array.dims.empty() || wrapped || array.data.size() != elements) {
      std::fprintf(stderr, "fuzz_idx: %zu dims (product wrapped: %d) and %zu bytes disagree\n",
                   array.dims.size(), static_cast<int>(wrapped), array.data.size());
      std::abort();
    }
  } catch (const dptrain::DataError&) {
    // The expected answer to a malformed file.
  }
  return 0;
}
