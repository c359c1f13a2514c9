// Keeping model replicas consistent: rank 0's initial state broadcast to all, BatchNorm running
// statistics averaged before evaluation, and a checksum that proves replicas are bit-identical.
// Not here: the per-step gradient all-reduce (reducer.h).
#pragma once

#include <torch/nn/module.h>

#include <cstdint>

#include "dptrain/parallel/distributed.h"

namespace dptrain {

// Copies rank 0's parameters and buffers to every rank, in registration order.
void broadcast_from_rank0(torch::nn::Module& model, Communicator& communicator);

// Replaces every floating-point buffer (BatchNorm running mean and variance) by its mean over
// the ranks, so that every rank evaluates the same model.
void average_buffers(torch::nn::Module& model, Communicator& communicator);

// A 63-bit hash of the exact bits of every parameter, in registration order.
int64_t parameter_checksum(const torch::nn::Module& model);

// All-reduces the checksum; throws CollectiveError when ranks differ, naming the step.
void check_replicas_identical(const torch::nn::Module& model, Communicator& communicator,
                              int64_t step);

}  // namespace dptrain
