// Tests for finite.h: all_finite finds a NaN or an infinity anywhere in any tensor, and never
// calls finite values non-finite, even where their sum would overflow float32.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <limits>
#include <vector>

#include "dptrain/train/finite.h"

namespace dptrain {
namespace {

bool finite(const std::vector<torch::Tensor>& tensors) {
  const auto answer = all_finite(tensors);
  EXPECT_EQ(answer.dim(), 0);
  EXPECT_EQ(answer.scalar_type(), torch::kBool);
  return answer.item<bool>();
}

TEST(AllFinite, FiniteValuesAreFiniteEvenWhereTheirSumOverflows) {
  EXPECT_TRUE(finite({}));
  EXPECT_TRUE(finite({torch::zeros({0})}));
  EXPECT_TRUE(finite({torch::randn({1000}), torch::randn({3, 5})}));
  const float largest = std::numeric_limits<float>::max();
  EXPECT_TRUE(finite({torch::full({1000}, largest)}));   // a sum of +inf
  EXPECT_TRUE(finite({torch::full({1000}, -largest)}));  // a sum of -inf
  EXPECT_TRUE(finite({torch::full({4}, std::numeric_limits<float>::denorm_min())}));
}

TEST(AllFinite, ANanOrAnInfinityAnywhereInAnyTensorIsFound) {
  const float bad_values[] = {std::numeric_limits<float>::quiet_NaN(),
                              std::numeric_limits<float>::infinity(),
                              -std::numeric_limits<float>::infinity()};
  for (const float bad : bad_values) {
    for (const int64_t at : {int64_t{0}, int64_t{4999}, int64_t{9999}}) {
      auto poisoned = torch::randn({10000});
      poisoned[at] = bad;
      EXPECT_FALSE(finite({poisoned})) << bad << " at " << at;
      EXPECT_FALSE(finite({torch::randn({7}), poisoned, torch::randn({3})})) << bad << " at " << at;
    }
  }
  // NaN next to infinities of both signs: aminmax must not let them cancel.
  auto mixed = torch::randn({100});
  mixed[1] = std::numeric_limits<float>::infinity();
  mixed[2] = -std::numeric_limits<float>::infinity();
  EXPECT_FALSE(finite({mixed}));
}

}  // namespace
}  // namespace dptrain
