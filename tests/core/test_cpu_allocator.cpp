// Tests for cpu_allocator.h: the caching allocator reuses blocks by size, keeps its footprint
// within its bound, serves LibTorch's tensors once installed without changing a training step's
// result by one bit; the guarded allocator stops a write past a tensor's end; an overwritten
// header is reported; the names of --cpu-allocator.
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
#include "dptrain/core/cpu_allocator.h"
#include "support/test_support.h"

namespace dptrain {
namespace {

using namespace dptrain::testing;

constexpr size_t kLarge = CachingCpuAllocator::kCachedFrom;

bool aligned_64(const void* p) { return reinterpret_cast<uintptr_t>(p) % 64 == 0; }

// This process's mapped address space (VmSize), in bytes.
size_t address_space_bytes() {
  std::ifstream status("/proc/self/status");
  std::string key;
  size_t kib = 0;
  while (status >> key) {
    if (key == "VmSize:") {
      status >> kib;
      break;
    }
  }
  return kib * 1024;
}

TEST(CachingCpuAllocator, ReusesAFreedBlockForARequestOfTheSameRoundedSize) {
  CachingCpuAllocator allocator;
  void* first = nullptr;
  {
    auto block = allocator.allocate(kLarge + 100);
    first = block.get();
    static_cast<char*>(first)[kLarge + 99] = 1;  // the whole request is writable
  }
  auto again = allocator.allocate(kLarge + 200);  // the same number of pages
  EXPECT_EQ(again.get(), first);
  auto other = allocator.allocate(kLarge + 8192);  // two pages more: another block
  EXPECT_NE(other.get(), first);
  const auto stats = allocator.stats();
  EXPECT_EQ(stats.hits, 1);
  EXPECT_EQ(stats.misses, 2);
  EXPECT_EQ(stats.evictions, 0);
  EXPECT_EQ(stats.cached_bytes, 0);
  EXPECT_EQ(stats.live_bytes, static_cast<int64_t>((kLarge + 4096) + (kLarge + 4096 + 8192)));
}

TEST(CachingCpuAllocator, SmallBlocksBypassTheCacheAndEveryBlockIs64ByteAligned) {
  CachingCpuAllocator allocator;
  for (const size_t bytes :
       {size_t{0}, size_t{1}, size_t{63}, size_t{4096}, kLarge - 1, kLarge, size_t{3} << 20}) {
    auto block = allocator.allocate(bytes);
    ASSERT_NE(block.get(), nullptr) << bytes;
    EXPECT_TRUE(aligned_64(block.get())) << bytes;
    EXPECT_EQ(block.get_deleter(), allocator.raw_deleter()) << bytes;
  }
  const auto stats = allocator.stats();
  EXPECT_EQ(stats.misses, 2);  // kLarge and 3 MiB; the five smaller ones never reach the cache
  EXPECT_EQ(stats.hits, 0);
  EXPECT_EQ(stats.live_bytes, 0);
  EXPECT_EQ(stats.cached_bytes, static_cast<int64_t>((kLarge + 4096) + (size_t{3} << 20) + 4096));
}

// A run whose sizes keep changing (here: every request a new size) must not hoard them all.
TEST(CachingCpuAllocator, FootprintStaysWithinItsBoundOfPeakLiveBytes) {
  CachingCpuAllocator allocator;
  std::vector<c10::DataPtr> held;
  for (int i = 0; i < 4; ++i) held.push_back(allocator.allocate(1 << 20));
  held.clear();  // peak live: 4 blocks of 1 MiB + a page
  const int64_t peak = allocator.stats().peak_live_bytes;
  ASSERT_EQ(peak, 4 * ((1 << 20) + 4096));
  for (int i = 1; i <= 40; ++i) {
    auto block = allocator.allocate((1 << 20) + static_cast<size_t>(i) * 4096);
    const auto stats = allocator.stats();
    EXPECT_LE(stats.live_bytes + stats.cached_bytes,
              CachingCpuAllocator::kFootprintPeaks * stats.peak_live_bytes)
        << "request " << i;
  }
  const auto stats = allocator.stats();
  EXPECT_GT(stats.evictions, 0);
  EXPECT_EQ(stats.hits, 0);
  EXPECT_EQ(stats.misses, 44);
  allocator.release_cached();
  EXPECT_EQ(allocator.stats().cached_bytes, 0);
}

// Caches 48 MiB, limits the address space to 24 MiB more than is mapped (the cache included),
// then asks for 40 MiB, which fits only once the cache is given back. Exits 0 when it got the
// block with the cache emptied.
[[noreturn]] void ask_for_more_than_fits_beside_the_cache() {
  constexpr size_t kMiB = 1 << 20;
  CachingCpuAllocator allocator;
  {
    std::vector<c10::DataPtr> blocks;
    for (int i = 0; i < 3; ++i) blocks.push_back(allocator.allocate(16 * kMiB));
  }  // the bound (twice the peak) keeps all three
  rlimit limit{};
  getrlimit(RLIMIT_AS, &limit);
  limit.rlim_cur = static_cast<rlim_t>(address_space_bytes() + 24 * kMiB);  // cache included
  if (setrlimit(RLIMIT_AS, &limit) != 0) std::_Exit(3);
  auto big = allocator.allocate(40 * kMiB);
  std::_Exit(big.get() != nullptr && allocator.stats().cached_bytes == 0 ? 0 : 4);
}

// The footprint bound may keep blocks the system needs back: out of memory, the cache is given
// back before a request fails. Address space is the limit here (RLIMIT_AS), in a child process.
TEST(CachingCpuAllocatorDeathTest, OutOfMemoryGivesTheCacheBackBeforeFailing) {
  EXPECT_EXIT(ask_for_more_than_fits_beside_the_cache(), ::testing::ExitedWithCode(0), "");
}

TEST(CachingCpuAllocator, ThreadsAllocatingAndFreeingAtOnceLeaveConsistentBooks) {
  CachingCpuAllocator allocator;
  constexpr int kThreads = 4, kRounds = 2000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 random(static_cast<unsigned>(t));
      std::vector<c10::DataPtr> mine;
      for (int i = 0; i < kRounds; ++i) {
        const size_t bytes = kLarge + (random() % 8) * 4096;
        mine.push_back(allocator.allocate(bytes));
        static_cast<unsigned char*>(mine.back().get())[bytes - 1] = static_cast<unsigned char>(t);
        if (mine.size() > 3) mine.erase(mine.begin() + static_cast<long>(random() % mine.size()));
      }
    });
  }
  for (auto& thread : threads) thread.join();
  const auto stats = allocator.stats();
  EXPECT_EQ(stats.live_bytes, 0);
  EXPECT_EQ(stats.hits + stats.misses, kThreads * kRounds);
  EXPECT_GT(stats.hits, stats.misses);
  EXPECT_LE(stats.cached_bytes, CachingCpuAllocator::kFootprintPeaks * stats.peak_live_bytes);
}


TEST(CachingCpuAllocatorDeathTest, AnOverwrittenHeaderIsReportedInOneLine) {
  EXPECT_EXIT(
      {
        CachingCpuAllocator allocator;
        auto block = allocator.allocate(kLarge);
        static_cast<char*>(block.get())[-8] ^= 0x55;  // what an underflowing neighbour does
        block.clear();
      },
      ::testing::ExitedWithCode(70), "^error: the CPU allocator found the header of block ");
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
  for (const auto kind :
       {CpuAllocatorKind::kCaching, CpuAllocatorKind::kSystem, CpuAllocatorKind::kGuarded}) {
    EXPECT_EQ(parse_cpu_allocator(cpu_allocator_name(kind)), kind);
  }
  EXPECT_EQ(expect_throws<UsageError>([] { parse_cpu_allocator("jemalloc"); }, {}),
            "--cpu-allocator: 'jemalloc' is not an allocator; expected caching, system or "
            "guarded");
}

}  // namespace
}  // namespace dptrain
