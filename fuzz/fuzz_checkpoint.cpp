// libFuzzer target for the checkpoint reader: any bytes must either parse into a checkpoint
// that serialises back to the very same bytes, or throw DataError. Another exception, a crash,
// a sanitizer report or a hang is a bug. What a good checkpoint holds is test_checkpoint's job.
#include <zlib.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "dptrain/core/errors.h"
#include "dptrain/train/checkpoint.h"

namespace {

constexpr size_t kHeaderBytes = 24;  // magic, version, payload size, CRC-32

void check_one(const std::vector<uint8_t>& bytes) {
  dptrain::Checkpoint checkpoint;
  try {
    checkpoint = dptrain::parse_checkpoint(bytes, "fuzz input");
  } catch (const dptrain::DataError&) {
    return;  // refused with a message: what the reader must do with bad bytes
  }
  // Accepted: the format has one encoding per checkpoint, so writing it again must reproduce
  // the input exactly (anything else means the reader accepted something it did not check).
  if (dptrain::serialize_checkpoint(checkpoint) != bytes) {
    std::fprintf(stderr, "fuzz_checkpoint: accepted bytes do not serialise back unchanged\n");
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<uint8_t> bytes(data, data + size);
  check_one(bytes);
  // The CRC turns away nearly every mutation before the payload parser sees it. So each input
  // is tried a second time with its header's payload size and CRC made to fit the rest.
  if (bytes.size() >= kHeaderBytes) {
    const uint64_t payload = bytes.size() - kHeaderBytes;
    for (int i = 0; i < 8; ++i) bytes[12 + i] = static_cast<uint8_t>(payload >> (8 * i));
    // Version 1's CRC covers the payload; later versions' the header before it too.
    const uint32_t version = uint32_t{bytes[8]} | uint32_t{bytes[9]} << 8 |
                             uint32_t{bytes[10]} << 16 | uint32_t{bytes[11]} << 24;
    uLong crc = ::crc32(0L, Z_NULL, 0);
    if (version != 1) crc = ::crc32(crc, bytes.data(), kHeaderBytes - 4);
    crc = ::crc32(crc, bytes.data() + kHeaderBytes, static_cast<uInt>(payload));
    for (int i = 0; i < 4; ++i) bytes[20 + i] = static_cast<uint8_t>(crc >> (8 * i));
    check_one(bytes);
  }
  return 0;
}
