// SHA-256 through OpenSSL's EVP digest interface. See sha256.h.
#include "dptrain/core/sha256.h"

#include <fcntl.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <sys/types.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>

#include "dptrain/core/errors.h"

namespace dptrain {

namespace {

// libcrypto's reason for the last failure, for a message that says more than "failed".
[[noreturn]] void throw_openssl_error(const std::string& what) {
  char reason[256] = "no reason given";
  if (const unsigned long code = ERR_get_error()) ERR_error_string_n(code, reason, sizeof reason);
  throw std::runtime_error("OpenSSL SHA-256: " + what + ": " + reason);
}

}  // namespace

Sha256::Sha256() : context_(EVP_MD_CTX_new()) {
  if (context_ == nullptr) throw_openssl_error("cannot allocate a digest context");
  if (EVP_DigestInit_ex(context_, EVP_sha256(), nullptr) != 1) {
    EVP_MD_CTX_free(context_);
    throw_openssl_error("cannot start a digest");
  }
}

Sha256::~Sha256() { EVP_MD_CTX_free(context_); }

void Sha256::update(const void* data, size_t size) {
  if (usable_ && EVP_DigestUpdate(context_, data, size) != 1) usable_ = false;
}

std::string Sha256::hex_digest() {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  const bool finished = usable_ && EVP_DigestFinal_ex(context_, digest, &length) == 1;
  usable_ = false;  // a finished context takes no more input
  if (!finished || length != 32) throw_openssl_error("cannot compute the digest");
  static constexpr char kHexDigits[] = "0123456789abcdef";
  std::string hex;
  for (unsigned int i = 0; i < length; ++i) {
    hex += kHexDigits[digest[i] >> 4];
    hex += kHexDigits[digest[i] & 0xf];
  }
  return hex;
}

std::string sha256_hex(const std::string& bytes) {
  Sha256 hash;
  hash.update(bytes);
  return hash.hex_digest();
}

std::string sha256_file_hex(const std::string& path) {
  Sha256 hash;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw DataError("cannot read " + path + ": " + std::strerror(errno));
  char chunk[1 << 16];
  for (;;) {
    const ssize_t got = ::read(fd, chunk, sizeof chunk);
    if (got == 0) break;
    if (got < 0) {
      if (errno == EINTR) continue;
      const int saved = errno;
      ::close(fd);
      throw DataError("cannot read " + path + ": " + std::strerror(saved));
    }
    hash.update(chunk, static_cast<size_t>(got));
  }
  ::close(fd);
  return hash.hex_digest();
}

}  // namespace dptrain
