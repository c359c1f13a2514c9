// Whether oneDNN's CPU convolutions write inside their tensors in channels-last, checked with the
// guarded allocator (cpu_allocator.h), which also sees the machine code oneDNN generates at run
// time. The AVX2 kernels are the positive control: the upstream bug (docs/channels-last.md) must
// stop at the guard page. The AVX-512 kernels, which dptrain runs channels-last by default where
// the CPU has them, must take a training step of the book's model at every width from 1 to 16
// (and 64) at these batches without a fault, in float32 and, at batch 96, in bf16. (The strided 1x1 convolution's
// overrun at odd batches is not theirs to meet: dptrain does not run that kernel, Note [The
// strided 1x1 convolution on the CPU].) Each case runs in a child process (a death test): the
// allocator is process-wide, and oneDNN reads its ISA cap once.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <torch/torch.h>

#include <cstdint>
#include <cstdlib>

#include "dptrain/core/cpu_allocator.h"
#include "dptrain/model/autocast.h"
#include "dptrain/model/memory_format.h"
#include "dptrain/model/model.h"

namespace dptrain {
namespace {

// The upstream repro's shape: the stage-2 shortcut at width 4, a 1x1 stride-2 convolution from
// 4 to 8 channels, forward and backward on a (256, 4, 28, 28) channels-last input, once (the
// repro runs it twice; under the guards the AVX2 overrun faults in the first, which is what
// lets model_step below take one step).
void shortcut_convolution_step(at::MemoryFormat layout = at::MemoryFormat::ChannelsLast) {
  torch::manual_seed(0);
  torch::nn::Conv2d conv(torch::nn::Conv2dOptions(4, 8, 1).stride(2));
  conv->weight.set_data(conv->weight.data().contiguous(layout));
  auto x = torch::rand({256, 4, 28, 28}).contiguous(layout);
  x.requires_grad_(true);
  conv->forward(x).sum().backward();
}

// One training step of the book's model at `width`, channels-last, on a batch of `batch`, the
// forward pass under `amp`: the forward and backward pass, which run every convolution kernel
// the model has at that width and batch. A second step ran the same kernels again (no optimizer
// step comes between: the same weights, inputs and shapes, oneDNN's cached primitives) on
// tensors of the same sizes, each ending at its own guard page, so it could only fault where
// the first did; it doubled the test's time (bench/results/2026-12-04-ci-times.md). The AVX2
// control (shortcut_convolution_step) keeps one step able to catch an overrun.
void model_step(int64_t width, int64_t batch, Amp amp = Amp::kOff) {
  torch::manual_seed(0);
  ResNet model(ResNetOptions{10, 1, width});
  init_reference_weights(*model, 0);
  convert_to_channels_last(*model);
  auto x = torch::rand({batch, 1, 28, 28}).contiguous(at::MemoryFormat::ChannelsLast);
  const auto y = torch::randint(10, {batch}, torch::kLong);
  torch::Tensor logits;
  {
    const AutocastGuard autocast(torch::kCPU, amp);
    logits = model->forward(x);
  }
  torch::nn::functional::cross_entropy(logits.to(torch::kFloat32), y).backward();
}

bool has_avx512() {
  CpuKernels cpu = detect_cpu_kernels();
  cpu.isa_cap.clear();  // the machine's own kernels, whatever the environment caps
  return cpu.runs_avx512();
}

TEST(GuardedKernelsDeathTest, Avx2ChannelsLastConvolutionStopsAtTheGuardPage) {
#if !(defined(__x86_64__) || defined(__i386__))
  GTEST_SKIP() << "oneDNN's AVX2 kernels exist only on x86";
#endif
  // Without the guard, this is the case that, run twice, ends in glibc's "double free or
  // corruption"; under it, the first run stops at the overrun's write.
  EXPECT_EXIT(
      {
        ::setenv("ONEDNN_MAX_CPU_ISA", "AVX2", 1);
        install_cpu_allocator(CpuAllocatorKind::kGuarded);
        at::set_num_threads(1);
        shortcut_convolution_step();
        std::exit(0);
      },
      ::testing::ExitedWithCode(70), "^error: segmentation fault at address 0x");
  // The control: the same kernels' contiguous path, under the same guards, runs clean, so the
  // fault above is the channels-last overrun, not the guarded allocator.
  EXPECT_EXIT(
      {
        ::setenv("ONEDNN_MAX_CPU_ISA", "AVX2", 1);
        install_cpu_allocator(CpuAllocatorKind::kGuarded);
        at::set_num_threads(1);
        shortcut_convolution_step(at::MemoryFormat::Contiguous);
        std::exit(0);
      },
      ::testing::ExitedWithCode(0), "");
}

// The AVX2 kernels, which every x86 CPU dptrain meets can run (ONEDNN_MAX_CPU_ISA=AVX2 selects
// them on an AVX-512 CPU too), at the widths whose stage-2 shortcut overruns natively (1 to 7)
// and beyond: with the strided 1x1 convolution out of the way (Note [The strided 1x1 convolution
// on the CPU]), every training step must stay inside its tensors, at the batches above and at
// an odd one. This is what lets dptrain run channels-last on AVX2 kernels.
TEST(GuardedKernelsDeathTest, Avx2ChannelsLastTrainsEveryWidthInBoundsWithoutTheStridedKernel) {
#if !(defined(__x86_64__) || defined(__i386__))
  GTEST_SKIP() << "oneDNN's AVX2 kernels exist only on x86";
#endif
  if (!detect_cpu_kernels().avx2) GTEST_SKIP() << "this CPU has no AVX2";
  for (const int threads : {1, 2}) {
    EXPECT_EXIT(
        {
          ::setenv("ONEDNN_MAX_CPU_ISA", "AVX2", 1);
          install_cpu_allocator(CpuAllocatorKind::kGuarded);
          at::set_num_threads(threads);
          for (int64_t width = 1; width <= 16; ++width) {
            model_step(width, 256);
            model_step(width, 96);
            model_step(width, 31);
          }
          model_step(64, 16);
          std::exit(0);
        },
        ::testing::ExitedWithCode(0), "")
        << threads << " thread(s)";
  }
}

TEST(GuardedKernelsDeathTest, Avx512ChannelsLastTrainsEveryWidthInBounds) {
  if (!has_avx512()) GTEST_SKIP() << "this CPU has no AVX-512: dptrain keeps it contiguous";
  if (const char* cap = std::getenv("ONEDNN_MAX_CPU_ISA"); cap && *cap) {
    GTEST_SKIP() << "ONEDNN_MAX_CPU_ISA=" << cap << " is set: not the AVX-512 kernels";
  }
  for (const int threads : {1, 2}) {
    EXPECT_EXIT(
        {
          install_cpu_allocator(CpuAllocatorKind::kGuarded);
          at::set_num_threads(threads);
          shortcut_convolution_step();
          for (int64_t width = 1; width <= 16; ++width) {
            model_step(width, 256);
            model_step(width, 96);  // the last batch of an epoch of 60,000 at 256
          }
          model_step(64, 16);
          // bf16: oneDNN's bf16 kernels and the fused BatchNorm's bf16 loops (Note [The fused
          // path in bf16]) at every channel count the widths give.
          for (int64_t width = 1; width <= 16; ++width) model_step(width, 96, Amp::kBFloat16);
          std::exit(0);
        },
        ::testing::ExitedWithCode(0), "")
        << threads << " thread(s)";
  }
}

}  // namespace
}  // namespace dptrain
