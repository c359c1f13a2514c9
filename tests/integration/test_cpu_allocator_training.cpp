// The caching CPU allocator (core/cpu_allocator.h) installed under a whole training run: a test
// that spans every layer, so it sits here rather than in tests/core/.
#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <torch/torch.h>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>
#include "dptrain/core/errors.h"
#include "dptrain/model/model.h"
#include "dptrain/core/cpu_allocator.h"
#include "dptrain/train/train.h"
#include "support/test_support.h"

namespace dptrain {
namespace {

using namespace dptrain::testing;

// Once installed, LibTorch's CPU tensors come from the cache, and a training step gives the same
// weights to the last bit as with LibTorch's allocator: reused memory is never read before it is
// written.
TEST(CachingCpuAllocator, InstalledItServesTensorsAndTrainingEndsBitIdentical) {
  TempDir dir;
  const auto data = synthetic_data(96, 16);
  TrainOptions options;
  options.epochs = 1;
  options.batch_size = 32;
  options.width = 4;
  options.threads = 1;
  options.seed = 5;
  options.timeout = std::chrono::seconds(60);
  options.save_model = dir.file("system.pt");
  train(data, options, cpu_world(2));  // before installing: LibTorch's own allocator

  install_cpu_allocator(CpuAllocatorKind::kCaching);
  ASSERT_EQ(c10::GetAllocator(c10::DeviceType::CPU)->raw_deleter(),
            CachingCpuAllocator().raw_deleter());
  const auto before = installed_cpu_allocator_stats();
  { auto t = torch::empty({1 << 20}); }
  { auto t = torch::empty({1 << 20}); }
  const auto after = installed_cpu_allocator_stats();
  EXPECT_EQ(after.misses + after.hits, before.misses + before.hits + 2);
  EXPECT_GE(after.hits, before.hits + 1);

  options.save_model = dir.file("caching.pt");
  train(data, options, cpu_world(2));
  EXPECT_GT(installed_cpu_allocator_stats().hits, after.hits);
  const auto parameters = [](const std::string& path) {
    ResNet model(ResNetOptions{10, 1, 4});
    dptrain::testing::load_model_file(model, path);
    return model->parameters();
  };
  const auto a = parameters(dir.file("system.pt")), b = parameters(dir.file("caching.pt"));
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << "parameter " << i;
}

}  // namespace
}  // namespace dptrain
