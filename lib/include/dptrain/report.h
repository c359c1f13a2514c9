// What a person reads: the line after each epoch and the final line in the book's format,
// "test acc: 0.93, 13.2 sec/epoch on [cuda:0]". Not here: where the lines go.
#pragma once

#include <string>
#include <vector>

#include "dptrain/train.h"

namespace dptrain {

// "epoch 3/10: train loss 0.3012, train acc 0.8891, test acc 0.8765, 13.2 s, 4545 img/s"
std::string format_epoch_line(const EpochStats& stats);

// "test acc: 0.93, 13.2 sec/epoch on [cuda:0, cuda:1]": the last epoch's test accuracy and the
// mean training time per epoch, as the book's train function prints them.
std::string format_final_line(const TrainResult& result);

}  // namespace dptrain
