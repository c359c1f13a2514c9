// The Unix socket of the forked test server (forked_test_server.cpp): where it lives, which
// binary it serves, binding or connecting to it at any path length, and whole reads and writes.
// Shared by the server and dptrain_test_client. Not here: what goes over it
// (forked_test_protocol.h).
#pragma once

#include <cstddef>
#include <string>

#include "support/forked_test_protocol.h"

namespace dptrain::testing::forked {

// $DPTRAIN_FORKED_TEST_SOCKET when set (tests/support/check_forked_tests.py runs a server of its
// own beside CTest's), else the test binary's canonical path with kSocketSuffix; "" when the
// binary's path cannot be resolved.
std::string socket_path_for(const std::string& binary);
// The identity of the file at `path` (following links); false with errno set when stat fails.
bool identify_binary(const std::string& path, BinaryIdentity& identity);

// A listening socket at `path` (mode 0600, the caller's umask kept), or -1 with errno set.
int listen_at(const std::string& path);
// A socket connected to `path`, or -1 with errno set (ENOENT, ECONNREFUSED: nobody serves).
int connect_to(const std::string& path);

// All `size` bytes, through EINTR and short transfers; false when the peer ended first or on an
// error. Writes never raise SIGPIPE.
bool read_exactly(int fd, void* buffer, size_t size);
bool write_all(int fd, const void* buffer, size_t size);

// The standard descriptors 0, 1 and 2 travel with a request's header (SCM_RIGHTS).
constexpr int kPassedDescriptors = 3;
// Sends `size` bytes in one message with this process's descriptors 0-2 attached.
bool send_with_standard_descriptors(int socket, const void* buffer, size_t size);
// Receives exactly `size` bytes and the descriptors sent with them into `fds` (close-on-exec;
// -1 where none came); false on a short read, an error or the 10-second limit set by the caller.
bool receive_with_descriptors(int socket, void* buffer, size_t size,
                              int (&fds)[kPassedDescriptors]);

}  // namespace dptrain::testing::forked
