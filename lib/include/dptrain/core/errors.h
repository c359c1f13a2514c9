// The kinds of failure dptrain reports to its user, so the driver can pick the exit status:
// a usage mistake (status 2) or a failure at run time (status 1). Broken internal invariants are
// not here: they are TORCH_CHECK / assert failures.
#pragma once

#include <stdexcept>

namespace dptrain {

// The user asked for something impossible: a bad flag value, a device that is not there.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Missing, unreadable or malformed data; the message names the file.
class DataError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A collective or the rendezvous failed or timed out: a peer died, stalled or never came.
class CollectiveError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace dptrain
