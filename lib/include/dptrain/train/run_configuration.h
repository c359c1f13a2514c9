// What every rank of a world must agree on before the first collective: the flags that shape
// the model, the data order and the step, the data itself (by digest) and where a resumed run
// starts. Ranks started differently would otherwise fail deep inside Gloo (another --width), wait
// out the timeout (another --batch-size) or train diverging replicas and exit 0 (another --lr).
// Not here: the exchange and the comparison (parallel/joined_world.h: check_same_settings) or
// the flags themselves (app/cli.cpp).
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace dptrain {

struct TrainOptions;

// One setting as a user would name it ("--lr") and its value as text ("0.10000000000000001").
using RunSetting = std::pair<std::string, std::string>;

// The settings of `options` that every rank must share, then the data and the start:
// `train_set` and `test_set` describe the data ("60000 images, SHA-256 ..."), `start` where the
// run begins ("the beginning", or a checkpoint's position).
std::vector<RunSetting> run_settings(const TrainOptions& options, const std::string& train_set,
                                     const std::string& test_set, const std::string& start);

// One line per setting, "name=value": what a rank publishes at the rendezvous.
std::string settings_text(const std::vector<RunSetting>& settings);

}  // namespace dptrain
