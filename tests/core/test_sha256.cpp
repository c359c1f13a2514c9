// Tests of the SHA-256 wrapper (sha256.h) against the FIPS 180-2 appendix B examples: the
// digest is OpenSSL's, the feeding in pieces, the hex text and the file reading are ours.
// Not here: the download that uses it (test_download.cpp).
#include <gtest/gtest.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "dptrain/core/sha256.h"
#include "support/test_support.h"

namespace dptrain {
namespace {

struct KnownDigest {
  std::string message;
  std::string hex;
};

class Sha256Known : public ::testing::TestWithParam<KnownDigest> {};

TEST_P(Sha256Known, OneShotMatchesPublishedDigest) {
  EXPECT_EQ(sha256_hex(GetParam().message), GetParam().hex);
}

// Every split point of the short messages, and byte by byte; the long one in 997-byte pieces.
TEST_P(Sha256Known, ChunkedUpdatesMatchOneShot) {
  const std::string& message = GetParam().message;
  if (message.size() > 1000) {
    Sha256 hash;
    for (size_t at = 0; at < message.size(); at += 997) hash.update(message.substr(at, 997));
    EXPECT_EQ(hash.hex_digest(), GetParam().hex);
    return;
  }
  for (size_t split = 0; split <= message.size(); ++split) {
    Sha256 hash;
    hash.update(message.substr(0, split));
    hash.update(message.substr(split));
    EXPECT_EQ(hash.hex_digest(), GetParam().hex) << "split at " << split;
  }
  Sha256 bytewise;
  for (char c : message) bytewise.update(&c, 1);
  EXPECT_EQ(bytewise.hex_digest(), GetParam().hex);
}

// FIPS 180-2, appendix B.1, B.2 and B.3; the empty message from NIST's example values.
INSTANTIATE_TEST_SUITE_P(
    Sha256Fips180, Sha256Known,
    ::testing::Values(
        KnownDigest{"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
        KnownDigest{"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
        KnownDigest{"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
                    "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
        KnownDigest{std::string(1000000, 'a'),
                    "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"}));

TEST(Sha256, ASecondDigestIsRefused) {
  Sha256 hash;
  hash.update(std::string("abc"));
  EXPECT_EQ(hash.hex_digest(), sha256_hex("abc"));
  EXPECT_THROW(hash.hex_digest(), std::runtime_error);
}

TEST(Sha256, FileDigestEqualsStringDigest) {
  testing::TempDir dir;
  std::vector<uint8_t> bytes(200000);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 31 + i / 251);
  testing::write_bytes(dir.file("blob"), bytes);
  EXPECT_EQ(sha256_file_hex(dir.file("blob")), sha256_hex(std::string(bytes.begin(), bytes.end())));
}

TEST(Sha256, MissingFileIsADataErrorNamingIt) {
  testing::TempDir dir;
  testing::expect_data_error([&] { sha256_file_hex(dir.file("absent")); },
                             {dir.file("absent"), "No such file"});
}

}  // namespace
}  // namespace dptrain
