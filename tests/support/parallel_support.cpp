// Test helpers that need the parallel layer; see parallel_support.h.
#include "support/parallel_support.h"

#include <signal.h>

#include <exception>
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

}  // namespace dptrain::testing
