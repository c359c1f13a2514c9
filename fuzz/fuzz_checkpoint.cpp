// libFuzzer target for the checkpoint reader: any bytes must either parse into a checkpoint or
// throw DataError. Files of versions 1 and 2 (DPTRNCKP) are read, never written; an accepted
// version 3 file (safetensors, whose JSON may be spaced or ordered otherwise) must serialise to
// a file that reads back to a checkpoint serialising to the same bytes again. Another
// exception, a crash, a sanitizer report or a hang is a bug. What a good checkpoint holds is
// test_checkpoint's job.
#include <zlib.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "dptrain/core/errors.h"
#include "dptrain/core/safetensors.h"
#include "dptrain/train/checkpoint.h"

namespace {

constexpr size_t kLegacyHeaderBytes = 24;  // magic, version, payload size, CRC-32

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "fuzz_checkpoint: %s\n", what);
  std::abort();
}

void check_one(const std::vector<uint8_t>& bytes) {
  dptrain::Checkpoint checkpoint;
  try {
    checkpoint = dptrain::parse_checkpoint(bytes, "fuzz input");
  } catch (const dptrain::DataError&) {
    return;  // refused with a message: what the reader must do with bad bytes
  }
  // DPTRNCKP is read and never written: an accepted file of it passed the reader's checks.
  if (checkpoint.format_version < dptrain::kCheckpointFormatVersion) return;
  const auto written = dptrain::serialize_checkpoint(checkpoint);
  dptrain::Checkpoint again;
  try {
    again = dptrain::parse_checkpoint(written, "rewritten");
  } catch (const dptrain::DataError&) {
    fail("an accepted checkpoint, written again, is refused");
  }
  if (dptrain::serialize_checkpoint(again) != written) {
    fail("an accepted checkpoint, written and read again, serialises otherwise");
  }
}

// The CRC (versions 1 and 2) and the digest (version 3) turn away nearly every mutation before
// the parsers behind them see it; these make them fit the rest, so that the rest is fuzzed.
void refit_legacy_crc(std::vector<uint8_t>& bytes) {
  const uint64_t payload = bytes.size() - kLegacyHeaderBytes;
  for (int i = 0; i < 8; ++i) bytes[12 + i] = static_cast<uint8_t>(payload >> (8 * i));
  // Version 1's CRC covers the payload; version 2's the header before it too.
  const uint32_t version = uint32_t{bytes[8]} | uint32_t{bytes[9]} << 8 |
                           uint32_t{bytes[10]} << 16 | uint32_t{bytes[11]} << 24;
  uLong crc = ::crc32(0L, Z_NULL, 0);
  if (version != 1) crc = ::crc32(crc, bytes.data(), kLegacyHeaderBytes - 4);
  crc = ::crc32(crc, bytes.data() + kLegacyHeaderBytes, static_cast<uInt>(payload));
  for (int i = 0; i < 4; ++i) bytes[20 + i] = static_cast<uint8_t>(crc >> (8 * i));
}

// The header's "dptrain.digest" value replaced by the one its content has (same length, so the
// layout stays); false when the bytes are no safetensors file with a digest of that form.
bool refit_digest(std::vector<uint8_t>& bytes) {
  try {
    // The header alone: the digest reads the data where it stands, no tensor is built.
    const uint64_t n = dptrain::safetensors_header_bytes(bytes.data(), bytes.size(), "fuzz input");
    const auto header =
        dptrain::parse_safetensors_header(bytes.data() + 8, n, bytes.size(), "fuzz input");
    const auto found = header.metadata.find("dptrain.digest");
    if (found == header.metadata.end()) return false;
    const std::string digest =
        dptrain::checkpoint_content_digest(header, bytes.data() + header.data_offset());
    if (found->second.size() != digest.size() || found->second == digest) return false;
    const std::string text(bytes.begin() + 8,
                           bytes.begin() + 8 + static_cast<long>(header.header_bytes));
    const size_t at = text.find(found->second);
    if (at == std::string::npos) return false;  // written with JSON escapes
    std::copy(digest.begin(), digest.end(), bytes.begin() + 8 + static_cast<long>(at));
    return true;
  } catch (const dptrain::DataError&) {
    return false;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<uint8_t> bytes(data, data + size);
  check_one(bytes);
  if (bytes.size() >= kLegacyHeaderBytes && std::string(bytes.begin(), bytes.begin() + 8) == "DPTRNCKP") {
    refit_legacy_crc(bytes);
    check_one(bytes);
  } else if (refit_digest(bytes)) {
    check_one(bytes);
  }
  return 0;
}
