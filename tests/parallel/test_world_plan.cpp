// Tests for world_plan.h: the replicas, ranks and backend chosen from the device flags, the
// launcher's environment (given as a map) and a GPU count (given, so no GPU is needed), and the
// errors when the devices asked for are not there; the CPU threads a run takes by default
// (devices.h). Not here: building the world (test_train.cpp).
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <ostream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "dptrain/core/errors.h"
#include "dptrain/core/devices.h"
#include "dptrain/parallel/rendezvous.h"
#include "dptrain/parallel/world_plan.h"
#include "support/test_support.h"

namespace dptrain {
namespace {

using Env = std::map<std::string, std::string>;

// torchrun's variables for rank `rank` of `world_size`, local rank `local_rank`.
Env torchrun(int rank, int world_size, int local_rank) {
  return {{"RANK", std::to_string(rank)},
          {"WORLD_SIZE", std::to_string(world_size)},
          {"LOCAL_RANK", std::to_string(local_rank)},
          {"MASTER_ADDR", "127.0.0.1"},
          {"MASTER_PORT", "29500"}};
}

struct PlanCase {
  const char* name;
  std::optional<std::string> devices;  // --devices
  std::optional<int> gpus;             // --gpus
  Env env;
  int cuda_devices;
  // The plan, or the error: `error` set means a UsageError whose message holds it.
  std::vector<std::string> local_devices;
  int first_rank = 0;
  int world_size = 1;
  const char* error = nullptr;
};

// gtest names a failing case by this rather than by its bytes.
void PrintTo(const PlanCase& c, std::ostream* out) { *out << c.name; }

class PlanWorld : public ::testing::TestWithParam<PlanCase> {};

TEST_P(PlanWorld, DevicesAndRanks) {
  const PlanCase& c = GetParam();
  const auto launch = read_launch_environment(c.env);
  if (c.error != nullptr) {
    try {
      plan_world(c.devices, c.gpus, launch, c.cuda_devices);
      ADD_FAILURE() << "no UsageError; expected one saying \"" << c.error << "\"";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(c.error), std::string::npos) << e.what();
    }
    return;
  }
  const WorldPlan world = plan_world(c.devices, c.gpus, launch, c.cuda_devices);
  std::vector<std::string> names;
  for (const auto& device : world.local_devices) names.push_back(device_name(device));
  EXPECT_EQ(names, c.local_devices);
  EXPECT_EQ(world.first_rank, c.first_rank);
  EXPECT_EQ(world.world_size, c.world_size);
  EXPECT_EQ(world.multi_process, launch.has_value());
  if (launch) {
    EXPECT_EQ(world.launch.local_rank, launch->local_rank);
  }
}

const Env kNoLauncher{{"HOME", "/root"}};

INSTANTIATE_TEST_SUITE_P(
    WorldPlan, PlanWorld,
    ::testing::Values(
        // One process, replicas in threads.
        PlanCase{"DefaultIsTheCpuWithoutGpus", {}, {}, kNoLauncher, 0, {"cpu"}},
        PlanCase{"DefaultIsTheFirstGpu", {}, {}, kNoLauncher, 2, {"cuda:0"}},
        PlanCase{
            "DevicesAsListed", "cpu, cpu,cpu", {}, kNoLauncher, 0, {"cpu", "cpu", "cpu"}, 0, 3},
        PlanCase{"GpusCountsFromZero", {}, 2, kNoLauncher, 4, {"cuda:0", "cuda:1"}, 0, 2},
        PlanCase{
            "CudaMeansTheFirstGpu", "cuda,cuda:1", {}, kNoLauncher, 2, {"cuda:0", "cuda:1"}, 0, 2},
        PlanCase{"MoreGpusThanTheMachineHas",
                 {},
                 3,
                 kNoLauncher,
                 2,
                 {},
                 0,
                 1,
                 "--gpus 3: this machine has 2 usable GPU(s)"},
        PlanCase{"GpuNamedWithoutCuda",
                 "cuda:0",
                 {},
                 kNoLauncher,
                 0,
                 {},
                 0,
                 1,
                 "--devices: 'cuda:0' needs CUDA"},
        PlanCase{"GpuBeyondTheMachine",
                 "cuda:2",
                 {},
                 kNoLauncher,
                 2,
                 {},
                 0,
                 1,
                 "'cuda:2' does not exist; this machine has 2 GPU(s), cuda:0 to cuda:1"},
        PlanCase{"NotADevice", "tpu", {}, kNoLauncher, 0, {}, 0, 1, "'tpu' is not a device"},
        // Under a launcher, one replica per process.
        PlanCase{"LauncherOnCpu", {}, {}, torchrun(3, 4, 1), 0, {"cpu"}, 3, 4},
        PlanCase{"LauncherLocalRankPicksItsGpu", {}, {}, torchrun(3, 4, 1), 2, {"cuda:1"}, 3, 4},
        PlanCase{"LauncherLocalRankWithoutAGpu",
                 {},
                 {},
                 torchrun(2, 4, 2),
                 2,
                 {},
                 0,
                 1,
                 "torchrun local rank 2 has no GPU: this machine has 2"},
        PlanCase{"LauncherOneCpuServesEveryRank", "cpu", {}, torchrun(1, 2, 1), 0, {"cpu"}, 1, 2},
        PlanCase{"LauncherPicksFromTheList",
                 "cuda:1,cuda:0",
                 {},
                 torchrun(1, 2, 1),
                 2,
                 {"cuda:0"},
                 1,
                 2},
        PlanCase{"LauncherListTooShort",
                 "cuda:0",
                 {},
                 torchrun(1, 2, 1),
                 2,
                 {},
                 0,
                 1,
                 "--devices lists 1 device(s) but this is local rank 1"},
        PlanCase{"LauncherGpusFlag", {}, 2, torchrun(1, 2, 1), 2, {"cuda:1"}, 1, 2}),
    [](const ::testing::TestParamInfo<PlanCase>& info) { return std::string(info.param.name); });

TEST(ChooseBackend, NamedBackendWins) {
  WorldPlan gpus;
  gpus.local_devices = {torch::Device(torch::kCUDA, 0)};
  EXPECT_EQ(choose_backend(std::string("gloo"), gpus, /*nccl_built=*/true), Backend::kGloo);
  WorldPlan cpus;
  cpus.local_devices = {torch::Device(torch::kCPU)};
  EXPECT_EQ(choose_backend(std::string("nccl"), cpus, /*nccl_built=*/false), Backend::kNccl);
}

TEST(ChooseBackend, DefaultIsNcclOnlyForGpusWithNcclBuilt) {
  WorldPlan gpus;
  gpus.local_devices = {torch::Device(torch::kCUDA, 0), torch::Device(torch::kCUDA, 1)};
  EXPECT_EQ(choose_backend(std::nullopt, gpus, /*nccl_built=*/true), Backend::kNccl);
  EXPECT_EQ(choose_backend(std::nullopt, gpus, /*nccl_built=*/false), Backend::kGloo);
  WorldPlan cpus;
  cpus.local_devices = {torch::Device(torch::kCPU)};
  EXPECT_EQ(choose_backend(std::nullopt, cpus, /*nccl_built=*/true), Backend::kGloo);
}

// The physical cores among the CPUs this process may use, counted here another way than
// devices.cpp does (it pairs core_id with physical_package_id): CPUs that share a core list the
// same thread_siblings_list. Without the topology in sysfs (some containers hide it), the CPUs.
int physical_cores_counted_from_siblings() {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (sched_getaffinity(0, sizeof mask, &mask) != 0) return 1;
  std::set<std::string> cores;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &mask)) continue;
    std::ifstream file("/sys/devices/system/cpu/cpu" + std::to_string(cpu) +
                       "/topology/thread_siblings_list");
    std::string siblings;
    if (!std::getline(file, siblings) || siblings.empty()) return CPU_COUNT(&mask);
    cores.insert(siblings);
  }
  return static_cast<int>(cores.size());
}

// Without --threads a run took LibTorch's default, which for Debian's 1.13 is one thread: the
// quickstart ran on one of two cores (563 s against 300 s). OMP_NUM_THREADS, when set, is the
// user's (or torchrun's) choice and LibTorch has applied it; otherwise one per physical core.
// LibTorch's own count is one while the default is asked for, whatever this LibTorch starts
// with: a default that follows LibTorch's then fails wherever the process may use two physical
// cores or more (the one-core runner cannot tell them apart). OMP_NUM_THREADS is set before a
// fresh process starts, as a user sets it, to two more threads than this machine has CPUs: no
// count of cores can pass for it. A LibTorch with MKL (PyPI's) sizes OpenMP's pool by MKL's
// count, which MKL caps at the physical cores while MKL_DYNAMIC is on (its default: 2.11 takes 2
// of OMP_NUM_THREADS=4 on two cores, and 4 with MKL_DYNAMIC=FALSE), so the child turns that off.
TEST(DefaultIntraOpThreads, OmpNumThreadsWinsElseThePhysicalCoresThisThreadMayUse) {
  const int cores = usable_cpu_cores();
  {
    const int asked = cores + 2;
    const testing::FreshChildEnvironment omp("OMP_NUM_THREADS", std::to_string(asked));
    const testing::FreshChildEnvironment mkl("MKL_DYNAMIC", "FALSE");
    EXPECT_EXIT(std::_Exit(default_intra_op_threads(std::getenv("OMP_NUM_THREADS")).threads),
                ::testing::ExitedWithCode(asked), "");
  }
  // Within the cgroup's CPU quota, where one is set (docker --cpus): tests/core/test_devices.cpp.
  const auto quota = cgroup_cpu_quota();
  const int physical = quota ? std::max(1, std::min(physical_cores_counted_from_siblings(), *quota))
                             : physical_cores_counted_from_siblings();
  const int libtorch_threads = at::get_num_threads();
  at::set_num_threads(1);  // Debian 1.13's default
  const int unset = default_intra_op_threads(nullptr).threads;
  const int empty = default_intra_op_threads("").threads;
  at::set_num_threads(libtorch_threads);
  EXPECT_EQ(unset, physical) << "LibTorch's own count, not one per physical core?";
  EXPECT_GE(unset, 1);
  EXPECT_LE(unset, cores);
  EXPECT_EQ(empty, unset);  // an empty variable is no setting
  // The affinity mask is the calling thread's: a thread pinned to one CPU may use one core.
  int pinned_cores = 0, pinned_default = 0;
  std::thread pinned([&] {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(sched_getcpu() >= 0 ? sched_getcpu() : 0, &one);
    if (sched_setaffinity(0, sizeof one, &one) != 0) return;
    pinned_cores = usable_cpu_cores();
    pinned_default = default_intra_op_threads(nullptr).threads;
  });
  pinned.join();
  EXPECT_EQ(pinned_cores, 1);
  EXPECT_EQ(pinned_default, 1);
}

// Two ranks on one host each took every core: the default divides them among the local ranks,
// and the figure says so (the first line prints the reason).
TEST(DefaultIntraOpThreads, LocalRanksShareTheCores) {
  const auto alone = default_intra_op_threads(nullptr, 1);
  const auto shared = default_intra_op_threads(nullptr, 2);
  EXPECT_EQ(shared.threads, std::max(1, alone.threads / 2));
  EXPECT_NE(shared.reason.find(", / 2 local ranks)"), std::string::npos) << shared.reason;
  EXPECT_EQ(alone.reason.find("local ranks"), std::string::npos) << alone.reason;
  EXPECT_EQ(default_intra_op_threads(nullptr, 1000).threads, 1);
}

// How many ranks share this host, from each launcher's variables.
TEST(LaunchEnvironment, LocalWorldSizeFromTheLauncher) {
  auto env = torchrun(1, 4, 1);
  EXPECT_EQ(read_launch_environment(env)->local_world_size, 4);  // loopback: all of them here
  env["LOCAL_WORLD_SIZE"] = "2";
  EXPECT_EQ(read_launch_environment(env)->local_world_size, 2);
  env.erase("LOCAL_WORLD_SIZE");
  env["MASTER_ADDR"] = "node0";
  EXPECT_EQ(read_launch_environment(env)->local_world_size, 1);  // not known: the whole host
  const Env slurm{{"SLURM_STEP_ID", "0"},          {"SLURM_PROCID", "5"},
                  {"SLURM_STEP_NUM_TASKS", "7"},   {"SLURM_LOCALID", "1"},
                  {"SLURM_NODEID", "2"},           {"SLURM_STEP_TASKS_PER_NODE", "2(x2),3"},
                  {"MASTER_ADDR", "node0"},        {"MASTER_PORT", "29500"}};
  EXPECT_EQ(read_launch_environment(slurm)->local_world_size, 3);
  auto first = slurm;
  first["SLURM_NODEID"] = "1";
  EXPECT_EQ(read_launch_environment(first)->local_world_size, 2);
  first["SLURM_STEP_TASKS_PER_NODE"] = "junk";
  EXPECT_EQ(read_launch_environment(first)->local_world_size, 1);
}

// 256 `cpu` entries never reached a first step in 150 s and printed nothing: one process runs
// at most kMaxReplicasPerProcess replicas (or one per GPU where it has more).
TEST(PlanWorldBounds, TooManyReplicasInOneProcessIsAUsageError) {
  std::string sixteen = "cpu", seventeen;
  for (int i = 1; i < 16; ++i) sixteen += ",cpu";
  seventeen = sixteen + ",cpu";
  EXPECT_EQ(plan_world(sixteen, {}, std::nullopt, 0).local_devices.size(), 16u);
  try {
    plan_world(seventeen, {}, std::nullopt, 0);
    ADD_FAILURE() << "17 replicas in one process were accepted";
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()),
              "--devices lists 17 replicas; one process runs at most 16 (each is a thread with its "
              "own model and a connection to every other); for more, start one process per rank "
              "with torchrun");
  }
  // A machine with 32 GPUs may list each once.
  std::string gpus = "cuda:0";
  for (int i = 1; i < 32; ++i) gpus += ",cuda:" + std::to_string(i);
  EXPECT_EQ(plan_world(gpus, {}, std::nullopt, 32).local_devices.size(), 32u);
}

}  // namespace
}  // namespace dptrain
