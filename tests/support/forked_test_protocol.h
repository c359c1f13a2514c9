// What dptrain_test_client (forked_test_client.cpp) and the test binary's server
// (forked_test_server.cpp) say to each other over the Unix socket beside the test binary: one
// request with the client's standard descriptors, one reply with the test's exit status.
// Not here: why the tests run this way (Note [Tests forked from a loaded binary],
// forked_test_server.cpp).
#pragma once

#include <cstdint>

namespace dptrain::testing::forked {

// The socket is the test binary's canonical path with this suffix, mode 0600.
constexpr char kSocketSuffix[] = ".forked.sock";
constexpr uint32_t kMagic = 0x46545044;  // "DPTF" read as bytes
constexpr uint32_t kVersion = 1;
// A request's strings (cwd, arguments, environment) never come near this; a larger one is refused.
constexpr uint64_t kMaxPayloadBytes = 16u << 20;

enum class RequestKind : uint32_t { kRun = 1, kStop = 2 };

// Which file a binary is: a server whose loaded binary is not the client's file is stale
// (identify_binary in forked_test_socket.h fills it, for both sides).
struct BinaryIdentity {
  uint64_t device = 0;
  uint64_t inode = 0;
  int64_t mtime_ns = 0;
  bool operator==(const BinaryIdentity& other) const {
    return device == other.device && inode == other.inode && mtime_ns == other.mtime_ns;
  }
};

// Sent with the client's descriptors 0, 1 and 2 (SCM_RIGHTS), then `payload_bytes` of
// NUL-terminated strings: the working directory, `argc` arguments (the first the test binary),
// `envc` environment entries.
struct Request {
  uint32_t magic = kMagic;
  uint32_t version = kVersion;
  RequestKind kind = RequestKind::kRun;
  uint32_t argc = 0;
  uint32_t envc = 0;
  uint32_t padding = 0;
  BinaryIdentity binary;  // the test binary as the client found it
  uint64_t payload_bytes = 0;
};

// tests/support/check_forked_tests.py sends a junk request of this size.
static_assert(sizeof(Request) == 56, "the request header's layout is the wire format");

enum class Outcome : uint32_t {
  kExited = 1,     // value: the exit status
  kSignaled = 2,   // value: the signal that ended the test
  kNotServed = 3,  // another binary or another environment: the client runs the test itself
  kStopping = 4,   // the answer to RequestKind::kStop
};

struct Reply {
  Outcome outcome = Outcome::kNotServed;
  int32_t value = 0;
};

}  // namespace dptrain::testing::forked
