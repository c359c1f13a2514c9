// The options of a run checked against the world it runs on, once, before any data is read or
// any device touched: the batch against the replicas, the threads against the cores, the backend
// against the devices and the build, each layout against its device. Only check_world makes a
// CheckedWorld, so whatever takes one (train, evaluate_weights) knows the check ran.
// Not here: the check of the options alone (options.h) or of the placements every rank learns at
// the rendezvous (world_plan.h).
#pragma once

#include <cstdint>

#include "dptrain/core/devices.h"
#include "dptrain/parallel/world_plan.h"
#include "dptrain/train/options.h"

namespace dptrain {

class CheckedWorld;

// Checks that `options` can run on `world` without touching data or devices, and returns them
// together; throws UsageError naming the flag.
CheckedWorld check_world(const TrainOptions& options, const WorldPlan& world);

// The options and the world plan that check_world accepted, as it saw them (copies: nothing
// changes them afterwards).
class CheckedWorld {
 public:
  const TrainOptions& options() const { return options_; }
  const WorldPlan& world() const { return world_; }

 private:
  friend CheckedWorld check_world(const TrainOptions& options, const WorldPlan& world);
  CheckedWorld(const TrainOptions& options, const WorldPlan& world)
      : options_(options), world_(world) {}

  TrainOptions options_;
  WorldPlan world_;
};

// Throws UsageError unless OMP_NUM_THREADS (`value`; null or empty: unset) is a whole number
// from 1 to `most_threads` (the usable cores, or the local replicas where more), as --threads
// must be. check_world runs it.
void check_omp_num_threads(const char* value, int cores, int64_t most_threads);

// The intra-op threads of this process and where the figure came from: --threads, else
// OMP_NUM_THREADS, else the physical cores (within the cgroup's CPU quota) shared among the
// launcher's ranks on this host (default_intra_op_threads).
ThreadDefault intra_op_threads(const TrainOptions& options, const WorldPlan& world);
int intra_op_thread_count(const TrainOptions& options, const WorldPlan& world);
// Sets them now, before the first parallel region (the data load) sizes LibTorch's OpenMP pool
// from the environment.
void start_intra_op_threads(const CheckedWorld& run);

}  // namespace dptrain
