// The figures of one training epoch, as printed, recorded in metrics files and kept in
// checkpoints. Plain data: who computes them is train.h, who formats them is report.h.
#pragma once

#include <cstdint>

namespace dptrain {

struct EpochStats {
  int64_t epoch = 0;  // 1-based
  int64_t epochs = 0;
  double train_loss = 0;  // mean cross-entropy over the epoch's training examples
  double train_acc = 0;
  double test_loss = 0;
  double test_acc = 0;
  double seconds = 0;  // training only, devices synchronised
  double images_per_second = 0;
  int64_t steps = 0;
};

}  // namespace dptrain
