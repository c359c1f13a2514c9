// Test helpers that need the parallel layer; see parallel_support.h.
#include "support/parallel_support.h"

#include <signal.h>

#include <algorithm>
#include <cstddef>
#include <exception>
#include <iostream>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "dptrain/parallel/rendezvous.h"

namespace dptrain::testing {

WorldPlan cpu_world(int replicas) {
  WorldPlan world;
  world.local_devices.assign(static_cast<size_t>(replicas), torch::Device(torch::kCPU));
  world.world_size = replicas;
  return world;
}

void run_thread_ranks(int world_size, const std::function<void(Communicator&)>& fn,
                      std::chrono::milliseconds timeout) {
  // As the dptrain binary does (app/signals.h): a rank whose peer closed its Gloo connection
  // gets EPIPE, not a SIGPIPE that ends the whole test. Put back after, for the tests that share
  // this process (and whose children would inherit the ignored signal).
  struct IgnoredSigpipe {
    void (*previous)(int) = signal(SIGPIPE, SIG_IGN);
    ~IgnoredSigpipe() { signal(SIGPIPE, previous); }
  } ignored_sigpipe;
  auto store = make_in_process_store(timeout);
  std::vector<std::exception_ptr> errors(static_cast<size_t>(world_size));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world_size; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        WorldOptions options;
        options.timeout = timeout;
        Communicator communicator(store, rank, world_size, options);
        fn(communicator);
      } catch (...) {
        errors[static_cast<size_t>(rank)] = std::current_exception();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (auto& error : errors) {
    if (error) std::rethrow_exception(error);
  }
}

double largest_difference(const std::vector<torch::Tensor>& a,
                          const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size())
    throw std::invalid_argument("largest_difference: lists differ in length");
  double largest = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const auto difference = (a[i].detach().to(torch::kDouble) - b[i].detach().to(torch::kDouble));
    largest = std::max(largest, difference.abs().max().item<double>());
  }
  return largest;
}

void LargestDifference::update(double difference) {
  std::lock_guard<std::mutex> lock(mutex_);
  largest_ = std::max(largest_, difference);
}

double LargestDifference::report(const std::string& what) const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::cout << "largest difference: " << what << " " << largest_ << std::endl;
  return largest_;
}

}  // namespace dptrain::testing
