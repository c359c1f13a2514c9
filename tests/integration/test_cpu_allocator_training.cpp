// CPU memory across the layers (core/cpu_allocator.h): the dptrain binary runs on tcmalloc, linked
// (Note [CPU memory: tcmalloc, not a cache of our own]), and a whole training run under the
// guarded allocator ends with the same weights to the last bit as under LibTorch's own.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "dptrain/model/model.h"
#include "dptrain/core/cpu_allocator.h"
#include "dptrain/train/train.h"
#include "support/train_support.h"
#include "support/test_support.h"

namespace dptrain {
namespace {

using namespace dptrain::testing;

bool built_with_address_sanitizer() {
#if defined(__SANITIZE_ADDRESS__)
  return true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
  return true;
#endif
#endif
  return false;
}

// The dynamic loader, not an environment variable, puts tcmalloc in front of glibc's malloc.
TEST(CpuMemory, TheDptrainBinaryLinksTcmalloc) {
  if (built_with_address_sanitizer()) {
    GTEST_SKIP() << "sanitizer builds link glibc's malloc (app/CMakeLists.txt)";
  }
  if (::access("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4", F_OK) != 0 &&
      ::access("/usr/lib/aarch64-linux-gnu/libtcmalloc_minimal.so.4", F_OK) != 0) {
    GTEST_SKIP() << "libtcmalloc-minimal4 is not installed (scripts/install-deps.sh installs it; "
                    "the build warned and linked glibc's malloc)";
  }
  const auto result = run_command({"ldd", dptrain_binary()});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.out.find("libtcmalloc_minimal.so.4"), std::string::npos) << result.out;
}

// A training run's tensors all come from the guarded allocator's own mappings, and the weights
// are those of LibTorch's allocator: nothing reads memory it did not write. In a child process,
// as the guarded allocator cannot be uninstalled.
TEST(GuardedCpuAllocatorDeathTest, TrainingUnderItEndsBitIdentical) {
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
  train(data, options, cpu_world(2));  // LibTorch's own allocator

  EXPECT_EXIT(
      {
        install_cpu_allocator(CpuAllocatorKind::kGuarded);
        options.save_model = dir.file("guarded.pt");
        train(data, options, cpu_world(2));
        std::exit(0);
      },
      ::testing::ExitedWithCode(0), "");
  const auto parameters = [](const std::string& path) {
    ResNet model(ResNetOptions{10, 1, 4});
    dptrain::testing::load_model_file(model, path);
    return model->parameters();
  };
  const auto a = parameters(dir.file("system.pt")), b = parameters(dir.file("guarded.pt"));
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << "parameter " << i;
}

}  // namespace
}  // namespace dptrain
