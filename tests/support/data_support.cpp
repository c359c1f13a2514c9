// Test helpers that need the data layer; see data_support.h.
#include "support/data_support.h"

#include <torch/torch.h>

#include <cstdint>
#include <exception>

namespace dptrain::testing {

FashionMnist synthetic_data(int64_t train, int64_t test) {
  // Callers in threads would race on LibTorch's global generator; the tests call it up front.
  torch::manual_seed(21);
  FashionMnist data;
  data.train.images = torch::randint(0, 256, {train, 28, 28}, torch::kUInt8);
  data.train.labels = torch::randint(0, 10, {train}, torch::kInt64);
  data.test.images = torch::randint(0, 256, {test, 28, 28}, torch::kUInt8);
  data.test.labels = torch::randint(0, 10, {test}, torch::kInt64);
  return data;
}

std::optional<std::string> real_data_dir() {
  try {
    return resolve_data_dir(std::nullopt);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

}  // namespace dptrain::testing
