// The reducer (parallel/reducer.h) on the book's model (model/model.h): a test that spans the two
// layers, so it sits here rather than in tests/parallel/.
#include <cstdint>
#include <gtest/gtest.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include <mutex>
#include "dptrain/model/model.h"
#include "dptrain/parallel/reducer.h"
#include "support/test_support.h"

namespace {

using namespace dptrain;

// cuDNN picks algorithms by pointer alignment, and vector kernels need it: every parameter and
// gradient starts at a multiple of 256 bytes, although fc.bias (10 floats) opens bucket 0.
TEST(Reducer, EveryParameterAndGradientIs256ByteAligned) {
  for (bool channels_last : {false, true}) {
    Communicator single;
    ResNet model(ResNetOptions{10, 1, 8});
    if (channels_last) convert_to_channels_last(*model);
    const auto params = model->parameters();
    Reducer reducer(params, single, /*bucket_bytes=*/16 * 1024);  // several buckets
    ASSERT_GT(reducer.num_buckets(), 2u);
    ASSERT_EQ(params.back().numel(), 10) << "fc.bias should be the last parameter";
    for (size_t i = 0; i < params.size(); ++i) {
      const auto data = reinterpret_cast<uintptr_t>(params[i].data_ptr());
      const auto grad = reinterpret_cast<uintptr_t>(params[i].grad().data_ptr());
      EXPECT_EQ(data % kBucketAlignmentBytes, 0u) << "parameter " << i << " " << channels_last;
      EXPECT_EQ(grad % kBucketAlignmentBytes, 0u) << "gradient " << i << " " << channels_last;
    }
  }
}

}  // namespace
