// Tests that need a GPU: replicas sharing one GPU over Gloo, the fast path's numerics on CUDA,
// NCCL's waits, timeouts and errors in a world of one, and ranks on one GPU that NCCL refuses.
// Each skips, saying why, on a machine without CUDA; bench/gpu_check.sh runs them on a GPU.
// Not here: what the CPU can show of the same code (test_distributed, test_train, test_reducer).
#include <gtest/gtest.h>
#include <signal.h>
#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "dptrain/core/errors.h"
#include "dptrain/model/model.h"
#include "dptrain/core/devices.h"
#include "dptrain/parallel/distributed.h"
#include "dptrain/parallel/rendezvous.h"
#include "dptrain/train/train.h"
#include "support/train_support.h"
#include "support/test_support.h"

#if defined(DPTRAIN_WITH_CUDA)
#include <ATen/cuda/Sleep.h>
#endif

namespace {

using namespace dptrain;
using namespace dptrain::testing;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

#define SKIP_WITHOUT_CUDA() \
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device"
#define SKIP_WITHOUT_NCCL() \
  SKIP_WITHOUT_CUDA();      \
  if (!backend_available(Backend::kNccl)) GTEST_SKIP() << "this build of dptrain has no NCCL"
#define SKIP_WITHOUT_GLOO()                            \
  if (!backend_available(Backend::kGloo))              \
  GTEST_SKIP() << "this build of dptrain has no Gloo " \
                  "(DPTRAIN_GLOO)"
#define SKIP_WITHOUT_DATA()              \
  const auto data_dir = real_data_dir(); \
  if (!data_dir) GTEST_SKIP() << "the real Fashion-MNIST is not installed (DPTRAIN_DATA)"

const torch::Device kGpu(torch::kCUDA, 0);

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::vector<torch::Tensor> load_parameters(const std::string& path, int64_t width) {
  ResNet model(ResNetOptions{10, 1, width});
  dptrain::testing::load_model_file(model, path);
  std::vector<torch::Tensor> values;
  for (const auto& p : model->parameters()) values.push_back(p.detach().clone());
  return values;
}

TrainOptions gpu_options() {
  TrainOptions options;
  options.epochs = 1;
  options.batch_size = 64;
  options.lr = 0.1;
  options.seed = 5;
  options.width = 8;
  options.timeout = 60s;
  // cuDNN's benchmark mode times every algorithm for each new shape: in tests, which meet a few
  // shapes for a few steps each, that is most of the GPU time. The book runs keep it on.
  options.cudnn_benchmark = false;
  return options;
}

WorldPlan gpu_world(int replicas) {
  WorldPlan world;
  world.local_devices.assign(static_cast<size_t>(replicas), kGpu);
  world.world_size = replicas;
  return world;
}

// ---- Replicas sharing one GPU --------------------------------------------------------------

// Two replicas on cuda:0, threads of one process, over Gloo (staging through host memory):
// --check-replicas compares their bits after every step and throws on the first difference.
TEST(CudaReplicas, TwoOnOneGpuOverGlooStayBitIdentical) {
  SKIP_WITHOUT_CUDA();
  SKIP_WITHOUT_GLOO();
  auto options = gpu_options();
  options.backend = Backend::kGloo;
  options.check_replicas_every = 1;
  const auto result = train(synthetic_data(512, 64), options, gpu_world(2));
  EXPECT_EQ(result.devices, (std::vector<std::string>{"cuda:0", "cuda:0"}));
  ASSERT_EQ(result.epochs.size(), 1u);
  EXPECT_TRUE(std::isfinite(result.epochs[0].train_loss));
}

// Note [Sync-bn needs a GPU per replica]: refused before it could deadlock.
TEST(CudaReplicas, SyncBnOnOneGpuInOneProcessIsRefused) {
  SKIP_WITHOUT_CUDA();
  auto options = gpu_options();
  options.backend = Backend::kGloo;
  options.sync_bn = true;
  EXPECT_THROW(train(synthetic_data(128, 16), options, gpu_world(2)), UsageError);
}

std::map<std::string, std::string> rank_env(int rank, int world, int port, int local_rank) {
  return {{"RANK", std::to_string(rank)},
          {"WORLD_SIZE", std::to_string(world)},
          {"LOCAL_RANK", std::to_string(local_rank)},
          {"MASTER_ADDR", "127.0.0.1"},
          {"MASTER_PORT", std::to_string(port)}};
}

// Lines of `text` that start with "error:".
int error_lines(const std::string& text) {
  int count = 0;
  size_t start = 0;
  while (start < text.size()) {
    if (text.compare(start, 6, "error:") == 0) ++count;
    const auto newline = text.find('\n', start);
    if (newline == std::string::npos) break;
    start = newline + 1;
  }
  return count;
}

// Where sync-bn is supported on one GPU, in two processes: they match one replica training on
// the whole global batch, up to float rounding. TF32 is off for this comparison
// (NVIDIA_TF32_OVERRIDE=0): its rounding would differ between the batch sizes' algorithms.
TEST(CudaReplicas, SyncBnProcessesOnOneGpuMatchOneReplica) {
  SKIP_WITHOUT_CUDA();
  SKIP_WITHOUT_GLOO();
  SKIP_WITHOUT_DATA();
  TempDir dir;
  const auto args = [&](const std::string& save) {
    return std::vector<std::string>{dptrain_binary(),    "train",   "--width",         "8",
                                    "--epochs",          "1",       "--batch-size",    "64",
                                    "--max-steps",       "2",       "--train-limit",   "256",
                                    "--test-limit",      "64",      "--seed",          "5",
                                    "--devices",         "cuda:0",  "--memory-format", "contiguous",
                                    "--cudnn-benchmark", "off",     "--timeout",       "60",
                                    "--data-dir",        *data_dir, "--save-model",    save};
  };
  const std::map<std::string, std::string> no_tf32{{"NVIDIA_TF32_OVERRIDE", "0"}};
  const auto one = run_command(args(dir.file("one.safetensors")), no_tf32, 300);
  ASSERT_EQ(one.exit_code, 0) << one.err;
  auto two = args(dir.file("two.safetensors"));
  two.insert(two.end(), {"--backend", "gloo", "--sync-bn"});
  const int port = free_port();
  auto env0 = rank_env(0, 2, port, 0), env1 = rank_env(1, 2, port, 0);
  env0.insert(no_tf32.begin(), no_tf32.end());
  env1.insert(no_tf32.begin(), no_tf32.end());
  auto rank0 = spawn_command(two, env0, dir.file("rank0"));
  auto rank1 = spawn_command(two, env1, dir.file("rank1"));
  const auto result0 = wait_command(rank0, 300);
  const auto result1 = wait_command(rank1, 300);
  ASSERT_EQ(result0.exit_code, 0) << result0.err;
  ASSERT_EQ(result1.exit_code, 0) << result1.err;
  const auto a = load_parameters(dir.file("one.safetensors"), 8);
  const auto b = load_parameters(dir.file("two.safetensors"), 8);
  ASSERT_EQ(a.size(), b.size());
  float worst = 0;
  for (size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, (a[i] - b[i]).abs().max().item<float>());
  EXPECT_LT(worst, 1e-4f) << "largest weight difference after 2 steps";
  std::printf("[ note ] sync-bn, 2 processes on cuda:0 against 1 replica: max |dw| = %g\n", worst);
}

// ---- The fast path on CUDA ------------------------------------------------------------------

// Channels-last and bf16 autocast against the contiguous float32 run, from the same weights on
// the same batches: the first loss moves by rounding only, and bf16 still learns.
TEST(CudaFastPath, ChannelsLastAndBf16StayNearFloat32) {
  SKIP_WITHOUT_CUDA();
  SKIP_WITHOUT_DATA();
  const auto data = load_fashion_mnist(*data_dir, 2048, 64);
  auto options = gpu_options();
  options.batch_size = 128;
  options.lr = 0.05;
  const auto losses = [&](bool channels_last, Amp amp) {
    options.memory_format = channels_last ? MemoryFormat::kChannelsLast : MemoryFormat::kContiguous;
    options.amp = amp;
    std::vector<double> out;
    train(data, options, gpu_world(1), nullptr,
          [&](const StepStats& s) { out.push_back(s.shard_loss); });
    return out;
  };
  const auto contiguous = losses(false, Amp::kOff);
  const auto channels_last = losses(true, Amp::kOff);
  const auto bf16 = losses(true, Amp::kBFloat16);
  ASSERT_EQ(contiguous.size(), 16u);
  ASSERT_EQ(bf16.size(), 16u);
  EXPECT_NEAR(channels_last[0], contiguous[0], 1e-3);
  EXPECT_NEAR(bf16[0], contiguous[0], 2e-2);
  const double first_half = std::accumulate(bf16.begin(), bf16.begin() + 8, 0.0);
  const double second_half = std::accumulate(bf16.begin() + 8, bf16.end(), 0.0);
  EXPECT_LT(second_half, first_half) << "bf16 training did not lower the loss";
  std::printf("[ note ] first loss: fp32 %.6f, channels-last %.6f, bf16 %.6f\n", contiguous[0],
              channels_last[0], bf16[0]);
}

// ---- NCCL in a world of one -----------------------------------------------------------------

Communicator nccl_world_of_one(std::chrono::milliseconds timeout) {
  WorldOptions options;
  options.backend = Backend::kNccl;
  options.timeout = timeout;
  return Communicator(make_in_process_store(timeout), 0, 1, options);
}

// The calls and their errors: a CPU tensor cannot start on NCCL, which is a CollectiveError
// naming the rank (a checksum left on the CPU would be such a tensor), and the group is
// then aborted, so every later collective fails at once.
TEST(NcclWorldOfOne, CollectivesRunAndFailuresAreCollectiveErrors) {
  SKIP_WITHOUT_NCCL();
  auto c = nccl_world_of_one(30s);
  const char* mode = std::getenv("TORCH_NCCL_ASYNC_ERROR_HANDLING");
  ASSERT_NE(mode, nullptr);
  EXPECT_STREQ(mode, "2");  // Note [NCCL failures end in our error line]
  auto t = torch::tensor({1.5f, -2.0f}, torch::TensorOptions().device(kGpu));
  c.allreduce_sum(t, "sum");
  c.allreduce_max(t, "max");
  c.broadcast(t, 0, "broadcast");
  auto pending = c.allreduce_sum_async(t, "async sum");
  c.wait(pending);
  c.wait_host("the read");
  c.barrier("barrier");
  EXPECT_TRUE(torch::equal(t.cpu(), torch::tensor({1.5f, -2.0f})));
  try {
    c.allreduce_sum(torch::ones({2}), "a sum of a CPU tensor");
    FAIL() << "expected a CollectiveError";
  } catch (const CollectiveError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 0 of 1: could not start a sum of a CPU tensor"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(c.allreduce_sum(t, "after the failure"), CollectiveError);
}

#if defined(DPTRAIN_WITH_CUDA)
// Cycles of at::cuda::sleep that take about `seconds` on this GPU. It idles at a low clock (345
// MHz on the H200s lent here, 1980 MHz busy) and its first kernels pay for loading, so one
// probe first brings it up to speed; the faster of two probes after it sets the rate. The tests
// then keep a 3x margin on every time they derive from it, for a clock that moves anyway.
int64_t sleep_cycles_for(double seconds) {
  constexpr int64_t kProbe = int64_t{1} << 26;
  double per_cycle = 0;
  for (int probe = 0; probe < 3; ++probe) {
    torch::cuda::synchronize();
    const auto start = Clock::now();
    at::cuda::sleep(kProbe);
    torch::cuda::synchronize();
    const double this_probe = seconds_since(start) / static_cast<double>(kProbe);
    if (probe == 1 || (probe == 2 && this_probe < per_cycle)) per_cycle = this_probe;
  }
  return static_cast<int64_t>(seconds / std::max(per_cycle, 1e-12));
}
#endif

// Note [Waiting without blocking the host]: wait() makes the stream wait and returns at once;
// the host blocks only in wait_host(). With a timeout given to Work::wait, as before, the host
// would have waited out the whole kernel in wait().
TEST(NcclWorldOfOne, WaitOrdersTheStreamWithoutBlockingTheHost) {
  SKIP_WITHOUT_NCCL();
#if defined(DPTRAIN_WITH_CUDA)
  auto c = nccl_world_of_one(60s);
  auto t = torch::ones({1 << 20}, torch::TensorOptions().device(kGpu));
  c.allreduce_sum(t, "warm-up");                 // creates the communicator
  const int64_t cycles = sleep_cycles_for(0.9);  // 3x the 0.3 s asked of it below
  const auto start = Clock::now();
  at::cuda::sleep(cycles);  // the all-reduce below starts only after this kernel
  auto pending = c.allreduce_sum_async(t, "the all-reduce behind a sleep");
  c.wait(pending);
  const double in_wait = seconds_since(start);
  c.wait_host("the read");
  const double in_total = seconds_since(start);
  EXPECT_GT(in_total, 0.3) << "the sleep kernel did not hold the all-reduce back";
  EXPECT_LT(in_wait, in_total / 5) << "wait() blocked the host";
  EXPECT_TRUE(torch::all(t == 1).item<bool>());
  std::printf("[ note ] host time in wait(): %.4f s; until done: %.3f s\n", in_wait, in_total);
  c.shutdown();
#endif
}

// A collective that cannot finish (held behind a kernel that outlives the timeout, as one
// waiting for a dead peer would be) ends in one CollectiveError naming the timeout, and the
// process lives on: with LibTorch's default error handling its watchdog would have ended it.
// (ncclCommAbort frees device memory, which waits for the sleeping kernel here; a kernel stuck
// on a dead peer sees the abort flag instead and ends at once.)
TEST(NcclWorldOfOne, StuckCollectiveEndsInACollectiveErrorWithinTheTimeout) {
  SKIP_WITHOUT_NCCL();
#if defined(DPTRAIN_WITH_CUDA)
  {
    auto c = nccl_world_of_one(1s);
    auto t = torch::ones({16}, torch::TensorOptions().device(kGpu));
    c.allreduce_sum(t, "warm-up");
    const int64_t cycles = sleep_cycles_for(3.0);  // 3x the timeout
    at::cuda::sleep(cycles);
    const auto start = Clock::now();
    try {
      // On NCCL the all-reduce's wait() only orders the streams and returns at once (Note
      // [Waiting without blocking the host]); the host waits where dptrain does, before it
      // reads a value, and that wait is bounded by the timeout.
      c.allreduce_sum(t, "the stuck all-reduce");
      c.wait_host("the read");
      FAIL() << "expected a CollectiveError";
    } catch (const CollectiveError& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find("rank 0 of 1: the stuck all-reduce (awaited before the read) "
                             "failed (timeout 1 s)"),
                std::string::npos)
          << message;
    }
    EXPECT_LT(seconds_since(start), 10.0);
    torch::cuda::synchronize();  // let the sleep end before the communicator goes
  }
  // The process is fine: a new group works.
  auto again = nccl_world_of_one(30s);
  auto t = torch::ones({4}, torch::TensorOptions().device(kGpu));
  again.allreduce_sum(t, "after the failure");
  EXPECT_TRUE(torch::all(t == 1).item<bool>());
  again.shutdown();
#endif
}

// --check-replicas on CUDA over a real NCCL group: the checksum travels as a CUDA tensor.
TEST(NcclWorldOfOne, CheckReplicasRunsOnCuda) {
  SKIP_WITHOUT_NCCL();
  auto options = gpu_options();
  options.backend = Backend::kNccl;
  options.process_group_for_one = true;
  options.check_replicas_every = 1;
  options.max_steps = 4;
  const auto result = train(synthetic_data(512, 64), options, gpu_world(1));
  ASSERT_EQ(result.epochs.size(), 1u);
  EXPECT_EQ(result.epochs[0].steps, 4);
}

// ---- Ranks in several processes ---------------------------------------------------------------

std::vector<std::string> process_args(const std::string& data_dir, const std::string& checkpoints) {
  return {dptrain_binary(),    "train", "--width",       "8",      "--epochs",         "1000",
          "--batch-size",      "64",    "--train-limit", "1024",   "--test-limit",     "64",
          "--timeout",         "10",    "--data-dir",    data_dir, "--checkpoint-dir", checkpoints,
          "--cudnn-benchmark", "off"};
}

// NCCL refuses two ranks on one GPU deep inside its first collective ("Duplicate GPU
// detected"); the gathered placements refuse it first, in one line per rank.
TEST(NcclProcesses, TwoRanksOnOneGpuAreRefusedInOneLine) {
  SKIP_WITHOUT_NCCL();
  SKIP_WITHOUT_DATA();
  TempDir dir;
  auto args = process_args(*data_dir, dir.file("checkpoints"));
  args.insert(args.end(), {"--backend", "nccl", "--devices", "cuda:0"});
  const int port = free_port();
  auto rank0 = spawn_command(args, rank_env(0, 2, port, 0), dir.file("rank0"));
  auto rank1 = spawn_command(args, rank_env(1, 2, port, 0), dir.file("rank1"));
  for (const auto& result : {wait_command(rank0, 120), wait_command(rank1, 120)}) {
    EXPECT_FALSE(result.timed_out);
    EXPECT_EQ(result.exit_code, 2) << result.err;
    EXPECT_EQ(error_lines(result.err), 1) << result.err;
    EXPECT_NE(result.err.find("error: --backend nccl: ranks 0 and 1 both use the GPU GPU-"),
              std::string::npos)
        << result.err;
  }
}

// Rank 1 is killed mid-run; rank 0 ends with one error line naming rank 1, exit status 1, and
// no abort, within the timeout and the diagnosis.
void expect_survivor_reports(const std::vector<std::string>& args, int local_rank_of_1,
                             const TempDir& dir) {
  const int port = free_port();
  auto rank0 = spawn_command(args, rank_env(0, 2, port, 0), dir.file("rank0"));
  auto rank1 = spawn_command(args, rank_env(1, 2, port, local_rank_of_1), dir.file("rank1"));
  for (int i = 0; i < 1200; ++i) {  // until the first checkpoint: training is under way
    std::ifstream out(rank0.out_path);
    std::string text((std::istreambuf_iterator<char>(out)), std::istreambuf_iterator<char>());
    if (text.find("checkpoint: ") != std::string::npos) break;
    std::this_thread::sleep_for(100ms);
  }
  std::this_thread::sleep_for(300ms);
  kill(rank1.pid, SIGKILL);
  const auto killed_at = Clock::now();
  const auto result = wait_command(rank0, 120);
  wait_command(rank1, 5);
  EXPECT_FALSE(result.timed_out);
  EXPECT_EQ(result.exit_code, 1) << result.err;
  EXPECT_EQ(error_lines(result.err), 1) << result.err;
  EXPECT_NE(result.err.find("error: rank 0 of 2"), std::string::npos) << result.err;
  EXPECT_NE(result.err.find("rank(s) 1 did not answer"), std::string::npos) << result.err;
  EXPECT_LT(seconds_since(killed_at), 30.0);  // --timeout 10, the diagnosis 3
  std::printf("[ note ] the survivor ended %.1f s after the kill\n", seconds_since(killed_at));
}

TEST(NcclProcesses, KilledRankEndsTheSurvivorWithOneErrorLine) {
  SKIP_WITHOUT_NCCL();
  if (cuda_device_count() < 2) GTEST_SKIP() << "needs two GPUs (NCCL takes one GPU per rank)";
  SKIP_WITHOUT_DATA();
  TempDir dir;
  auto args = process_args(*data_dir, dir.file("checkpoints"));
  args.insert(args.end(), {"--backend", "nccl"});
  expect_survivor_reports(args, /*local_rank_of_1=*/1, dir);
}

TEST(GlooCudaProcesses, KilledRankEndsTheSurvivorWithOneErrorLine) {
  SKIP_WITHOUT_CUDA();
  SKIP_WITHOUT_GLOO();
  SKIP_WITHOUT_DATA();
  TempDir dir;
  auto args = process_args(*data_dir, dir.file("checkpoints"));
  args.insert(args.end(), {"--backend", "gloo", "--devices", "cuda:0"});
  expect_survivor_reports(args, /*local_rank_of_1=*/0, dir);
}

}  // namespace
