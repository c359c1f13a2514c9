// Test helpers that need the parallel layer: a world of CPU replicas, and ranks as threads.
#pragma once

#include <chrono>
#include <functional>

#include "dptrain/parallel/distributed.h"
#include "dptrain/parallel/world_plan.h"

namespace dptrain::testing {

// `replicas` CPU replicas, threads of this process.
WorldPlan cpu_world(int replicas);

// Runs fn(communicator) on `world_size` threads, each one rank of a Gloo world over loopback
// with the given timeout. Rethrows the first failure after all threads have ended.
void run_thread_ranks(int world_size, const std::function<void(Communicator&)>& fn,
                      std::chrono::milliseconds timeout = std::chrono::seconds(60));

}  // namespace dptrain::testing
