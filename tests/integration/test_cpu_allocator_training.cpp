// CPU memory across the layers (core/cpu_allocator.h): the dptrain binary runs on tcmalloc, linked
// (Note [CPU memory: tcmalloc, not a cache of our own]), and a whole training run under the
// guarded allocator ends with the same weights to the last bit as under LibTorch's own.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <string>

#include "dptrain/model/model.h"
#include "support/cli_support.h"
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
// are those of LibTorch's allocator: nothing reads memory it did not write. The binary, twice:
// the guarded allocator is installed before LibTorch's first tensor and thread (main does it),
// which a test process that has trained already, or a child forked from it, cannot give it
// (LibTorch 2.11 refuses to size its OpenMP pool in a forked child).
TEST(GuardedCpuAllocator, TrainingUnderItEndsBitIdentical) {
  TempDir out;
  const auto run_with = [&](const std::string& allocator) {
    const std::string model = out.file(allocator + ".safetensors");
    const auto result = run_dptrain(
        {"train", "--data-dir", tiny_data_dir(), "--devices", "cpu,cpu", "--width", "4",
         "--epochs", "1", "--batch-size", "4", "--threads", "1", "--seed", "5",
         "--cpu-allocator", allocator, "--save-model", model, "--quiet"},
        {}, 600);
    EXPECT_EQ(result.exit_code, 0) << describe(result);
    return model;
  };
  const std::string system = run_with("system"), guarded = run_with("guarded");
  const auto parameters = [](const std::string& path) {
    ResNet model(ResNetOptions{10, 1, 4});
    dptrain::testing::load_model_file(model, path);
    return model->parameters();
  };
  const auto a = parameters(system), b = parameters(guarded);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << "parameter " << i;
}

}  // namespace
}  // namespace dptrain
