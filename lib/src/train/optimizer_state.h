// The optimizer's state a checkpoint keeps beside the weights (Checkpoint::state): the momentum
// buffers and --ema's averaged weights, taken from a rank's training and given back to a
// resumed one. Not here: the file format (checkpoint.h) or the update itself
// (parallel/bucket_sgd.h). Internal to lib/src/train/.
#pragma once

#include <torch/types.h>

#include <string>
#include <utility>
#include <vector>

#include "dptrain/model/model.h"
#include "dptrain/parallel/bucket_sgd.h"
#include "dptrain/train/checkpoint_types.h"

namespace dptrain {

// Every parameter's momentum buffer once there are any ("momentum.<name>"), and with --ema
// (`averaged` not empty) the averaged weights ("ema.<name>"): CPU copies.
std::vector<std::pair<std::string, torch::Tensor>> optimizer_state(const ResNet& model,
                                                                   const BucketSgd& sgd,
                                                                   const ResNet& averaged);

// A resume's state from `start` (read from `name`): the momentum buffers where it has them (a
// run whose every step was skipped has none yet), and the averaged weights, which a run with
// --ema always saves. A part that is missing or incomplete is a DataError naming the tensor.
void load_optimizer_state(const Checkpoint& start, const std::string& name, const ResNet& model,
                          BucketSgd& sgd, ResNet& averaged);

}  // namespace dptrain
