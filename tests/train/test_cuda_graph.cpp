// --cuda-graph (cuda_graph_step.h): where it is refused, checked on any machine, and with a GPU
// that steps replayed from the graph end exactly where the same steps run eagerly end.
// The GPU suite is CudaGraph.*, for a GPU check to filter on; it skips without CUDA.
// Not here: the flag's parsing (tests/app/test_cli.cpp) and the binary's error lines
// (tests/integration/test_binary_runs.cpp).
#include <ATen/Context.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dptrain/core/devices.h"
#include "dptrain/core/errors.h"
#include "dptrain/model/model.h"
#include "dptrain/train/cuda_graph_step.h"
#include "dptrain/train/train.h"
#include "support/train_support.h"
#include "support/test_support.h"

namespace dptrain {
namespace {

using testing::TempDir;
using testing::train;

const torch::Device kGpu0(torch::kCUDA, 0);
const torch::Device kGpu1(torch::kCUDA, 1);

TrainOptions graph_options() {
  TrainOptions options;
  options.cuda_graph = true;
  options.backend = Backend::kNccl;
  return options;
}

// `devices` in this process, of a world of `world_size` ranks (more: other processes).
WorldPlan world_of(std::vector<torch::Device> devices, int world_size) {
  WorldPlan world;
  world.local_devices = std::move(devices);
  world.world_size = world_size;
  world.multi_process = world_size > static_cast<int>(world.local_devices.size());
  return world;
}

// check_cuda_graph must throw a UsageError of one line naming --cuda-graph and `phrase`.
void expect_refused(const TrainOptions& options, const WorldPlan& world, bool cuda_built,
                    const std::string& phrase) {
  const auto message = testing::expect_throws<UsageError>(
      [&] { check_cuda_graph(options, world, cuda_built); }, {"--cuda-graph", phrase});
  EXPECT_EQ(message.find('\n'), std::string::npos) << "not one line: " << message;
}

// ---- Where the flag is refused (no GPU needed) -------------------------------------------------

TEST(CudaGraphUsage, CpuDevicesAreRefusedInEveryBuild) {
  auto options = graph_options();
  options.backend = Backend::kGloo;
  for (const bool cuda_built : {true, false}) {
    expect_refused(options, testing::cpu_world(1), cuda_built, "needs CUDA devices");
    expect_refused(options, testing::cpu_world(2), cuda_built, "cpu is not a GPU");
  }
  // Through check_world, as the binary and train() see it, in this very build.
  const auto message = testing::expect_throws<UsageError>(
      [&] { check_world(options, testing::cpu_world(1)); }, {"--cuda-graph needs CUDA devices"});
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
}

TEST(CudaGraphUsage, ABuildWithoutCudaRefusesIt) {
  expect_refused(graph_options(), world_of({kGpu0}, 1), /*cuda_built=*/false,
                 "this build of dptrain has no CUDA");
  // DPTRAIN_WITH_CUDA_GRAPH: set for this file where the library's graph code is compiled
  // (tests/CMakeLists.txt), that is in a CUDA build not configured with -DDPTRAIN_CUDA_GRAPH=OFF.
#if defined(DPTRAIN_WITH_CUDA) && defined(DPTRAIN_WITH_CUDA_GRAPH)
  constexpr bool kGraphBuild = true;
#else
  constexpr bool kGraphBuild = false;
#endif
  EXPECT_EQ(cuda_graph_available(), kGraphBuild);
}

// An environment variable set while it lives, and put back as it was after.
class ScopedVariable {
 public:
  ScopedVariable(std::string name, const char* value) : name_(std::move(name)) {
    if (const char* old = std::getenv(name_.c_str())) old_ = old;
    ::setenv(name_.c_str(), value, /*overwrite=*/1);
  }
  ~ScopedVariable() {
    if (old_) {
      ::setenv(name_.c_str(), old_->c_str(), 1);
    } else {
      ::unsetenv(name_.c_str());
    }
  }
  ScopedVariable(const ScopedVariable&) = delete;
  ScopedVariable& operator=(const ScopedVariable&) = delete;

 private:
  std::string name_;
  std::optional<std::string> old_;
};

// Blocking wait makes ProcessGroupNCCL query the events of captured collectives, which breaks
// the capture: refused under either name, in every spelling c10d reads as on, wherever NCCL
// collectives would be captured, and only there; c10d's off spellings and the new name's off
// over the old name's on run (test_distributed.cpp reads every spelling).
TEST(CudaGraphUsage, NcclBlockingWaitIsRefusedNamingTheVariable) {
  for (const std::string name : {"TORCH_NCCL_BLOCKING_WAIT", "NCCL_BLOCKING_WAIT"}) {
    for (const std::string on : {"1", "TRUE", "y"}) {
      const ScopedVariable blocking(name, on.c_str());
      expect_refused(graph_options(), world_of({kGpu0}, 2), true,
                     "--cuda-graph over NCCL cannot run with " + name + "=" + on);
      auto one = graph_options();
      one.process_group_for_one = true;  // --backend nccl named for one GPU: a real NCCL group
      expect_refused(one, world_of({kGpu0}, 1), true, "unset " + name);
      // A world of one without a process group runs no collective: nothing to break.
      EXPECT_NO_THROW(check_cuda_graph(graph_options(), world_of({kGpu0}, 1), true));
    }
    for (const std::string off : {"0", "false", "No"}) {
      const ScopedVariable blocking(name, off.c_str());
      EXPECT_NO_THROW(check_cuda_graph(graph_options(), world_of({kGpu0}, 2), true)) << off;
    }
    const ScopedVariable bad(name, "on");  // c10d refuses it: so does dptrain, in one line
    const auto message = testing::expect_throws<UsageError>(
        [&] { check_cuda_graph(graph_options(), world_of({kGpu0}, 2), true); },
        {name + "='on' is not a value LibTorch's NCCL process group reads"});
    EXPECT_EQ(message.find('\n'), std::string::npos) << "not one line: " << message;
  }
  const ScopedVariable old_on("NCCL_BLOCKING_WAIT", "1");
  const ScopedVariable new_off("TORCH_NCCL_BLOCKING_WAIT", "false");
  EXPECT_NO_THROW(check_cuda_graph(graph_options(), world_of({kGpu0}, 2), true));
}

// Gloo's collectives run on the host: a graph cannot hold them.
TEST(CudaGraphUsage, GlooCollectivesAreRefused) {
  auto options = graph_options();
  options.backend = Backend::kGloo;
  expect_refused(options, world_of({kGpu0}, 2), true, "cannot capture Gloo's collectives");
  options.process_group_for_one = true;  // --backend gloo named for one GPU
  expect_refused(options, world_of({kGpu0}, 1), true, "use --backend nccl");
}

// NCCL inside a graph: one GPU per process only (replicas in threads are refused).
TEST(CudaGraphUsage, SeveralGpusInOneProcessAreRefused) {
  expect_refused(graph_options(), world_of({kGpu0, kGpu1}, 2), true,
                 "2 GPUs in one process: NCCL collectives captured in CUDA graphs may deadlock "
                 "with several GPUs per process; run one process per GPU (torchrun "
                 "--nproc-per-node=2");
}

TEST(CudaGraphUsage, OneGpuPerProcessIsAllowed) {
  const auto options = graph_options();
  EXPECT_NO_THROW(check_cuda_graph(options, world_of({kGpu0}, 1), true));
  EXPECT_NO_THROW(check_cuda_graph(options, world_of({kGpu0}, 4), true));  // torchrun rank
  auto one = options;
  one.backend = Backend::kGloo;  // a world of one without a process group communicates nothing
  EXPECT_NO_THROW(check_cuda_graph(one, world_of({kGpu0}, 1), true));
  auto off = options;
  off.cuda_graph = false;
  EXPECT_NO_THROW(check_cuda_graph(off, testing::cpu_world(2), false));
}

// ---- Replayed steps against eager steps (GPU) -------------------------------------------------

// The model's parameters and buffers (BatchNorm statistics and counts), in order.
std::vector<std::pair<std::string, torch::Tensor>> saved_state(const std::string& path,
                                                               int64_t width) {
  ResNet model(ResNetOptions{kNumClasses, 1, width});
  dptrain::testing::load_model_file(model, path);
  std::vector<std::pair<std::string, torch::Tensor>> state;
  for (const auto& item : model->named_parameters()) state.emplace_back(item.key(), item.value());
  for (const auto& item : model->named_buffers()) state.emplace_back(item.key(), item.value());
  return state;
}

// cuDNN's deterministic algorithms while it lives (a process-wide setting).
class DeterministicCudnn {
 public:
  DeterministicCudnn() : was_(at::globalContext().deterministicCuDNN()) {
    at::globalContext().setDeterministicCuDNN(true);
  }
  ~DeterministicCudnn() { at::globalContext().setDeterministicCuDNN(was_); }
  DeterministicCudnn(const DeterministicCudnn&) = delete;
  DeterministicCudnn& operator=(const DeterministicCudnn&) = delete;

 private:
  bool was_;
};

struct GraphCase {
  std::string name;
  Amp amp = Amp::kOff;
  bool sync_bn = false;
  NonFinite on_nonfinite = NonFinite::kStop;
  int64_t checkpoint_every_steps = 0;  // step checkpoints (in-place BatchNorm averaging)
  bool nccl_group = false;             // a real NCCL group of one: its all-reduces inside the graph
};

void PrintTo(const GraphCase& c, std::ostream* out) { *out << c.name; }

class CudaGraph : public ::testing::TestWithParam<GraphCase> {};

// Two epochs of 8 full batches and a smaller ninth: 3 warm-up steps, the capture, 12 replays,
// and 2 eager last batches, with an evaluation between the epochs. cuDNN's benchmark is off and
// its algorithms deterministic, so the graph launches the very kernels the eager steps launch,
// on the same data at equally aligned addresses (the caching allocator and the graph's pool both
// align to 512 bytes): the weights, the BatchNorm statistics and the printed loss must agree
// bit for bit, not to a tolerance.
TEST_P(CudaGraph, ReplayedStepsMatchEagerStepsBitForBit) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  if (!cuda_graph_available()) GTEST_SKIP() << "built with -DDPTRAIN_CUDA_GRAPH=OFF";
  const GraphCase& c = GetParam();
  if (c.nccl_group && !backend_available(Backend::kNccl)) {
    GTEST_SKIP() << "this build of dptrain has no NCCL";
  }
  TempDir dir;
  const DeterministicCudnn deterministic;
  const auto data = testing::synthetic_data(8 * 64 + 16, 128);
  const WorldPlan world = world_of({kGpu0}, 1);
  const auto run = [&](bool graphed) {
    TrainOptions options;
    options.epochs = 2;
    options.batch_size = 64;
    options.lr = 0.1;
    options.seed = 5;
    options.width = 8;
    options.cudnn_benchmark = false;
    options.amp = c.amp;
    options.sync_bn = c.sync_bn;
    options.on_nonfinite = c.on_nonfinite;
    options.backend = backend_available(Backend::kNccl) ? Backend::kNccl : Backend::kGloo;
    options.process_group_for_one = c.nccl_group;
    options.cuda_graph = graphed;
    const std::string name = graphed ? "graph" : "eager";
    if (c.checkpoint_every_steps > 0) {
      options.checkpoint_dir = dir.file(name);
      testing::make_directories(*options.checkpoint_dir);
      options.checkpoint_every_steps = c.checkpoint_every_steps;
    }
    options.save_model = dir.file(name + ".pt");
    return train(data, options, world);
  };
  const auto eager = run(false);
  const auto graphed = run(true);

  EXPECT_EQ(eager.graph_replays, 0);
  EXPECT_EQ(graphed.graph_replays, 2 * 8 - kCudaGraphWarmupSteps);
  ASSERT_EQ(graphed.epochs.size(), eager.epochs.size());
  for (size_t e = 0; e < eager.epochs.size(); ++e) {
    EXPECT_EQ(graphed.epochs[e].train_loss, eager.epochs[e].train_loss) << "epoch " << e + 1;
    EXPECT_EQ(graphed.epochs[e].train_acc, eager.epochs[e].train_acc) << "epoch " << e + 1;
    EXPECT_EQ(graphed.epochs[e].test_loss, eager.epochs[e].test_loss) << "epoch " << e + 1;
  }
  const auto want = saved_state(dir.file("eager.pt"), 8);
  const auto got = saved_state(dir.file("graph.pt"), 8);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_TRUE(torch::equal(got[i].second, want[i].second))
        << want[i].first << ": largest difference "
        << (got[i].second.to(torch::kFloat64) - want[i].second.to(torch::kFloat64))
               .abs()
               .max()
               .item<double>();
  }
}

// No prefix: the tests are CudaGraph.ReplayedStepsMatchEagerStepsBitForBit/<case>.
INSTANTIATE_TEST_SUITE_P(
    , CudaGraph,
    ::testing::Values(GraphCase{"fp32"}, GraphCase{"bf16", Amp::kBFloat16},
                      GraphCase{"sync_bn", Amp::kOff, /*sync_bn=*/true},
                      GraphCase{"skip", Amp::kOff, false, NonFinite::kSkip},
                      GraphCase{"step_checkpoints", Amp::kOff, false, NonFinite::kStop, 5},
                      GraphCase{"nccl_group_of_one", Amp::kOff, false, NonFinite::kStop, 0,
                                /*nccl_group=*/true},
                      GraphCase{"nccl_bf16_sync_bn", Amp::kBFloat16, true, NonFinite::kStop, 0,
                                /*nccl_group=*/true}),
    [](const ::testing::TestParamInfo<GraphCase>& info) { return info.param.name; });

}  // namespace
}  // namespace dptrain
