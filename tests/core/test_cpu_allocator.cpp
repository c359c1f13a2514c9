// Tests for cpu_allocator.h: the guarded allocator stops a write past a tensor's end or into a
// freed one, and reports an overwritten header; the names of --cpu-allocator. That the binary
// links tcmalloc: tests/integration/test_cpu_allocator_training.cpp.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <csignal>
#include <cstdint>
#include <string>

#include "dptrain/core/cpu_allocator.h"
#include "dptrain/core/errors.h"
#include "support/test_support.h"

namespace dptrain {
namespace {

using namespace dptrain::testing;

bool aligned_64(const void* p) { return reinterpret_cast<uintptr_t>(p) % 64 == 0; }

TEST(GuardedCpuAllocatorDeathTest, AnOverwrittenHeaderIsReportedInOneLine) {
  EXPECT_EXIT(
      {
        GuardedCpuAllocator allocator;
        auto block = allocator.allocate(3264);
        static_cast<char*>(block.get())[-8] ^= 0x55;  // what a write under the tensor's start does
        block.clear();
      },
      ::testing::ExitedWithCode(70),
      "^error: the guarded CPU allocator found the header of block ");
}

TEST(GuardedCpuAllocatorDeathTest, AWritePastTheEndStopsAtTheWrite) {
  GuardedCpuAllocator allocator;
  {
    auto block = allocator.allocate(3264);  // the size oneDNN's AVX2 kernels overran by 8 bytes
    auto* bytes = static_cast<volatile char*>(block.get());
    bytes[0] = 1;
    bytes[3263] = 1;  // the last byte is the block's
    EXPECT_TRUE(aligned_64(block.get()));
  }
  EXPECT_EXIT(
      {
        auto block = allocator.allocate(3264);
        static_cast<volatile char*>(block.get())[3264 + 7] = 1;
      },
      ::testing::KilledBySignal(SIGSEGV), "");
  EXPECT_EXIT(
      {
        auto block = allocator.allocate(3264);
        auto* stale = static_cast<volatile char*>(block.get());
        block.clear();
        stale[0] = 1;  // a write into a freed tensor
      },
      ::testing::KilledBySignal(SIGSEGV), "");
  // Installed, the fault is reported in one line with its address, and the exit status is 70.
  EXPECT_EXIT(
      {
        install_cpu_allocator(CpuAllocatorKind::kGuarded);
        auto t = torch::empty({816});  // 3,264 bytes
        static_cast<volatile float*>(t.data_ptr<float>())[817] = 1;
      },
      ::testing::ExitedWithCode(70),
      "^error: segmentation fault at address 0x[0-9a-f]{16} under --cpu-allocator guarded: a "
      "read or write outside a tensor");
}

TEST(CpuAllocatorNames, RoundTripAndAnUnknownNameIsAUsageError) {
  for (const auto kind : {CpuAllocatorKind::kSystem, CpuAllocatorKind::kGuarded}) {
    EXPECT_EQ(parse_cpu_allocator(cpu_allocator_name(kind)), kind);
  }
  EXPECT_EQ(expect_throws<UsageError>([] { parse_cpu_allocator("jemalloc"); }, {}),
            "--cpu-allocator: 'jemalloc' is not an allocator; expected system or guarded");
  // The name of the allocator that was removed says where its job went.
  EXPECT_EQ(expect_throws<UsageError>([] { parse_cpu_allocator("caching"); }, {}),
            "--cpu-allocator: 'caching' is not an allocator (the caching allocator is gone: "
            "tcmalloc, linked into dptrain, does its job); expected system or guarded");
}

}  // namespace
}  // namespace dptrain
