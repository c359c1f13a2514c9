// SHA-256 (FIPS 180-4), fed incrementally, for checking downloaded files against known digests.
// Not a general crypto library: no HMAC, no other hash, no constant-time guarantees.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace dptrain {

class Sha256 {
 public:
  Sha256();

  // Appends `size` bytes to the message. May be called any number of times, with any split.
  void update(const void* data, size_t size);
  void update(const std::string& bytes) { update(bytes.data(), bytes.size()); }

  // Pads and finishes the message; returns the 64-character lower-case hex digest. The object
  // must not be updated afterwards (reset() starts a new message).
  std::string hex_digest();

  void reset();

 private:
  void compress(const uint8_t* block);  // one 64-byte block

  std::array<uint32_t, 8> state_;
  std::array<uint8_t, 64> buffer_;  // the unprocessed tail of the message
  size_t buffered_ = 0;             // bytes used in buffer_
  uint64_t total_bytes_ = 0;        // message length so far
  bool finished_ = false;
};

// The hex digest of a whole string, or of a whole file (throws DataError naming the path when it
// cannot be read).
std::string sha256_hex(const std::string& bytes);
std::string sha256_file_hex(const std::string& path);

}  // namespace dptrain
