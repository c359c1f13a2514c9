// Test helpers that need the data layer: synthetic data and where the real data set is.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "dptrain/data/data.h"

namespace dptrain::testing {

// `train` and `test` random images and labels from a fixed seed: enough to compare runs with
// each other, no files needed.
FashionMnist synthetic_data(int64_t train, int64_t test);

// Where the real Fashion-MNIST is (resolve_data_dir without a flag), or nullopt.
std::optional<std::string> real_data_dir();

}  // namespace dptrain::testing
