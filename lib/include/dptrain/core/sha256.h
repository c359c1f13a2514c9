// SHA-256 digests for checking downloaded files against known values, computed by OpenSSL's EVP
// interface (libcrypto, which libcurl loads anyway). Not a crypto API: hex digests only.
#pragma once

#include <cstddef>
#include <string>

struct evp_md_ctx_st;  // OpenSSL's EVP_MD_CTX, kept out of this header

namespace dptrain {

// A digest fed incrementally, for data that arrives in pieces.
class Sha256 {
 public:
  Sha256();  // throws std::runtime_error when libcrypto cannot start a SHA-256 digest
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  // Appends `size` bytes to the message, with any split. Never throws (it runs inside libcurl's
  // callbacks); a failure inside libcrypto is reported by hex_digest().
  void update(const void* data, size_t size);
  void update(const std::string& bytes) { update(bytes.data(), bytes.size()); }

  // Finishes the message: the 64-character lower-case hex digest. Call it once, last. Throws
  // std::runtime_error when libcrypto failed, or when called again.
  std::string hex_digest();

 private:
  evp_md_ctx_st* context_;
  bool usable_ = true;  // false once libcrypto failed or the digest is finished
};

// The hex digest of a whole string, or of a whole file (throws DataError naming the path when it
// cannot be read).
std::string sha256_hex(const std::string& bytes);
std::string sha256_file_hex(const std::string& path);

}  // namespace dptrain
