// Tests for devices.h's share of the CPU: the cgroup's CPU quota read from a fake cgroup tree
// (v2's cpu.max, v1's cfs files, a parent's quota, a hybrid mount) and the arithmetic that
// divides the usable cores among the ranks on a host; the memory peaks of the process and of a
// GPU. Not here: device lists and the default
// against the real machine (tests/parallel/test_world_plan.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <string>

#include "dptrain/core/devices.h"
#include "support/test_support.h"

namespace dptrain {
namespace {

// Writes `text` at `root` + `/` + `name`, making the directories on the way (POSIX calls: Note
// [No std::filesystem] in lib/src/core/files.cpp).
void write(const testing::TempDir& root, const std::string& name, const std::string& text) {
  const std::string path = root.file(name);
  testing::make_directories(path.substr(0, path.rfind('/')));
  std::ofstream(path) << text;
}

// ---- The cgroup's quota ----------------------------------------------------------------------

// docker --cpus 2 on cgroup v2: the container's own cgroup is the namespace's root.
TEST(CgroupCpuQuota, V2CpuMaxAtTheRootOfAContainer) {
  testing::TempDir root;
  write(root, "cgroup.controllers", "cpu memory\n");
  write(root, "cpu.max", "200000 100000\n");
  EXPECT_EQ(cgroup_cpu_quota(root.path(), "0::/\n"), std::optional<int>(2));
  write(root, "cpu.max", "max 100000\n");
  EXPECT_EQ(cgroup_cpu_quota(root.path(), "0::/\n"), std::nullopt);
}

// 1.5 cores' time is one whole core (rounded down); a quota under one core is still one thread.
TEST(CgroupCpuQuota, RoundsDownAndIsAtLeastOne) {
  testing::TempDir root;
  write(root, "cgroup.controllers", "cpu\n");
  write(root, "cpu.max", "150000 100000\n");
  EXPECT_EQ(cgroup_cpu_quota(root.path(), "0::/\n"), std::optional<int>(1));
  write(root, "cpu.max", "50000 100000\n");
  EXPECT_EQ(cgroup_cpu_quota(root.path(), "0::/\n"), std::optional<int>(1));
  write(root, "cpu.max", "350000 50000\n");
  EXPECT_EQ(cgroup_cpu_quota(root.path(), "0::/\n"), std::optional<int>(7));
}

// A quota on a parent binds the child: the smallest along the path wins.
TEST(CgroupCpuQuota, V2TakesTheSmallestQuotaUpThePath) {
  testing::TempDir root;
  write(root, "cgroup.controllers", "cpu\n");
  write(root, "system.slice/cpu.max", "300000 100000\n");
  write(root, "system.slice/job.scope/cpu.max", "max 100000\n");
  EXPECT_EQ(cgroup_cpu_quota(root.path(), "0::/system.slice/job.scope\n"), std::optional<int>(3));
  write(root, "system.slice/job.scope/cpu.max", "100000 100000\n");
  EXPECT_EQ(cgroup_cpu_quota(root.path(), "0::/system.slice/job.scope\n"), std::optional<int>(1));
}

// cgroup v1: cpu.cfs_quota_us / cpu.cfs_period_us under the cpu controller's mount; -1 is none.
TEST(CgroupCpuQuota, V1CfsQuotaUnderTheCpuControllersMount) {
  testing::TempDir root;
  write(root, "cpu,cpuacct/cpu.cfs_quota_us", "-1\n");
  write(root, "cpu,cpuacct/cpu.cfs_period_us", "100000\n");
  const std::string proc = "12:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n0::/\n";
  EXPECT_EQ(cgroup_cpu_quota(root.path(), proc), std::nullopt);
  // The container sees its host's path, which does not exist under its own mount: the mount's
  // root is the container's cgroup.
  write(root, "cpu,cpuacct/cpu.cfs_quota_us", "400000\n");
  EXPECT_EQ(cgroup_cpu_quota(root.path(), proc), std::optional<int>(4));
  // Where the path does exist, its own quota counts too.
  write(root, "cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "200000\n");
  write(root, "cpu,cpuacct/docker/abc/cpu.cfs_period_us", "100000\n");
  EXPECT_EQ(cgroup_cpu_quota(root.path(), proc), std::optional<int>(2));
}

// A hybrid host mounts v2 at unified/ (without the cpu controller); nothing there, no file, or
// junk in a file is no quota.
TEST(CgroupCpuQuota, NothingReadableIsNoQuota) {
  testing::TempDir root;
  write(root, "unified/cgroup.procs", "1\n");
  EXPECT_EQ(cgroup_cpu_quota(root.path(), "1:cpu:/\n0::/\n"), std::nullopt);
  EXPECT_EQ(cgroup_cpu_quota(root.path(), ""), std::nullopt);
  write(root, "cgroup.controllers", "cpu\n");
  for (const char* junk : {"", "abc 100000\n", "-5 100000\n", "100000 0\n", "100000\n"}) {
    write(root, "cpu.max", junk);
    EXPECT_EQ(cgroup_cpu_quota(root.path(), "0::/\n"), std::nullopt) << junk;
  }
  EXPECT_EQ(cgroup_cpu_quota("/no/such/cgroup/root", "0::/\n"), std::nullopt);
}

// ---- Sharing the cores -----------------------------------------------------------------------

// The image's dptrain-launch 2 on 8 cores under docker --cpus 4: each rank took all 8 threads
// (5.3 times slower than one each). min(cores, quota) / local ranks, at least one.
TEST(ShareCores, DividesTheSmallerOfCoresAndQuotaAmongTheLocalRanks) {
  const auto share = share_cores(8, 4, 2);
  EXPECT_EQ(share.threads, 2);
  EXPECT_EQ(share.reason, "2 threads (8 cores, quota 4, / 2 local ranks)");
  EXPECT_EQ(share_cores(8, std::nullopt, 2).reason, "4 threads (8 cores, / 2 local ranks)");
  EXPECT_EQ(share_cores(8, std::nullopt, 1).reason, "8 threads (8 cores)");
  EXPECT_EQ(share_cores(8, 16, 1).reason, "8 threads (8 cores, quota 16)");
  EXPECT_EQ(share_cores(2, std::nullopt, 2).reason, "1 thread (2 cores, / 2 local ranks)");
  EXPECT_EQ(share_cores(1, std::nullopt, 1).reason, "1 thread (1 core)");
  // More ranks than cores, a rounding-down share, nonsense counts: never below one thread.
  EXPECT_EQ(share_cores(2, std::nullopt, 8).threads, 1);
  EXPECT_EQ(share_cores(7, std::nullopt, 2).threads, 3);
  EXPECT_EQ(share_cores(8, 3, 2).threads, 1);
  EXPECT_EQ(share_cores(0, 0, 0).threads, 1);
}

// OMP_NUM_THREADS=3, set before the process starts as a user or torchrun sets it: 3 threads,
// whatever the cores and the local ranks here, and the reason says where the count came from.
TEST(ShareCores, OmpNumThreadsIsTakenAsItIs) {
  const testing::FreshChildEnvironment omp("OMP_NUM_THREADS", "3");
  EXPECT_EXIT(
      {
        const auto chosen = default_intra_op_threads(std::getenv("OMP_NUM_THREADS"), 4);
        std::fprintf(stderr, "chosen: %s\n", chosen.reason.c_str());
        std::_Exit(chosen.threads);
      },
      ::testing::ExitedWithCode(3), "chosen: 3 threads \\(OMP_NUM_THREADS\\)");
}

// ---- Memory peaks ----------------------------------------------------------------------------

// The peak is read after the block is freed (a block this large is its own mapping, which free
// returns to the system): a reading of the resident size now, not of the peak, falls short.
TEST(PeakMemory, HostPeakCoversMemoryTouchedAndTheCpuHasNoDevicePeak) {
  const double before = peak_host_bytes();
  ASSERT_GT(before, 0);
  // 64 MiB more than the peak so far, written so that every page is resident.
  const size_t bytes = static_cast<size_t>(before) + (64u << 20);
  {
    std::unique_ptr<char[]> block(new char[bytes]);
    std::memset(block.get(), 1, bytes);
    asm volatile("" : : "r"(block.get()) : "memory");  // the writes happen, the block is not elided
    EXPECT_EQ(block[bytes - 1], 1);
  }
  EXPECT_GE(peak_host_bytes(), static_cast<double>(bytes));
  EXPECT_TRUE(std::isnan(peak_device_bytes(torch::kCPU)));
}

TEST(PeakMemory, ADevicePeakCoversATensorAllocatedThere) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU";
  const torch::Device gpu(torch::kCUDA, 0);
  const auto tensor = torch::ones({64 << 20}, torch::dtype(torch::kUInt8).device(gpu));
  EXPECT_GE(peak_device_bytes(gpu), static_cast<double>(64 << 20));
  EXPECT_EQ(tensor.sum().item<int64_t>(), int64_t{64} << 20);
}

}  // namespace
}  // namespace dptrain
