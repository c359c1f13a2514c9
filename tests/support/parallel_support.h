// Test helpers that need the parallel layer: a world of CPU replicas, and ranks as threads.
#pragma once

#include <torch/types.h>

#include <chrono>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "dptrain/parallel/distributed.h"
#include "dptrain/parallel/world_plan.h"

namespace dptrain::testing {

// `replicas` CPU replicas, threads of this process.
WorldPlan cpu_world(int replicas);

// Runs fn(communicator) on `world_size` threads, each one rank of a Gloo world over loopback
// with the given timeout. Rethrows the first failure after all threads have ended.
void run_thread_ranks(int world_size, const std::function<void(Communicator&)>& fn,
                      std::chrono::milliseconds timeout = std::chrono::seconds(60));

// The largest absolute difference between two lists of tensors of the same shapes (as double).
double largest_difference(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b);

// The largest of the differences that thread ranks measure, printed once by report() as
// "largest difference: <what> <value>" for the record of an equivalence test.
class LargestDifference {
 public:
  void update(double difference);
  double report(const std::string& what) const;  // prints and returns the largest

 private:
  mutable std::mutex mutex_;
  double largest_ = 0;
};

}  // namespace dptrain::testing
