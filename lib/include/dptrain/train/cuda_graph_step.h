// --cuda-graph: the whole training step (zero grad, forward, loss, backward with the bucket
// all-reduces, the SGD update unless --on-nonfinite skip must see the gradient first) captured
// once in a CUDA graph after a few eager steps, then replayed for every full batch; its rules are
// Note [Capturing the whole step] in cuda_graph_step.cpp. Not here: the step itself (rank.cpp).
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dptrain/parallel/distributed.h"
#include "dptrain/parallel/world_plan.h"
#include "dptrain/train/options.h"

namespace dptrain {

// Full batches run eagerly on the graph's stream before the capture, so that cuDNN's benchmark
// has timed its algorithms, that stream's cuBLAS handle and workspace exist and NCCL's
// communicator is up: made by the start's broadcast in a world of several ranks, by the first
// warm-up step's all-reduce in a world of one (PyTorch's whole-network example warms up for three).
constexpr int64_t kCudaGraphWarmupSteps = 3;

// True where this build can capture CUDA graphs (built against a CUDA LibTorch, and not
// configured with -DDPTRAIN_CUDA_GRAPH=OFF).
bool cuda_graph_available();

// Throws UsageError, one line naming --cuda-graph, where options.cuda_graph cannot run on
// `world`: a build without CUDA graphs (`cuda_built` false; pass cuda_graph_available()), CPU
// devices, Gloo collectives, several GPUs in one process, or NCCL collectives with blocking wait
// on, as c10d reads TORCH_NCCL_BLOCKING_WAIT and its old name NCCL_BLOCKING_WAIT
// (nccl_blocking_wait: 1/y/yes/t/true in any case, the new name winning; a value c10d refuses
// is refused too).
// check_world calls it.
void check_cuda_graph(const TrainOptions& options, const WorldPlan& world, bool cuda_built);

// One rank's graphed step. Every step of a run with --cuda-graph goes through run(), on the
// graph's own stream, ordered after the work the caller queued before and before what it
// queues after.
class CudaGraphStep {
 public:
  // The step on x (n, 1, 28, 28) and y (n). Returns the tensors the caller reads afterwards.
  using Body =
      std::function<std::vector<torch::Tensor>(const torch::Tensor& x, const torch::Tensor& y)>;

  // For a CUDA `device`; `full_rows` is the shard size of a full global batch (the only size
  // captured). The communicator's collectives may be captured, and its timeout bounds
  // wait_host(). Both must outlive this object.
  CudaGraphStep(const torch::Device& device, Communicator& communicator, int64_t full_rows,
                int64_t warmup_steps = kCudaGraphWarmupSteps);
  ~CudaGraphStep();
  CudaGraphStep(const CudaGraphStep&) = delete;
  CudaGraphStep& operator=(const CudaGraphStep&) = delete;

  // Runs `make` with the graph's stream current. The Reducer must be made this way: autograd
  // runs each gradient accumulator on the stream current when it was made, and the capture must
  // see all of backward on its stream.
  void on_graph_stream(const std::function<void()>& make);

  // One step: a batch of `full_rows` rows is copied into the static inputs; the first
  // `warmup_steps` such batches run `body` eagerly, the next is captured and replayed, and
  // every later one is only replayed. A batch of another size (an epoch's last) runs `body`
  // eagerly on its own tensors. Returns body's outputs; after a replay, the static outputs
  // that every replay rewrites (read them before the next run()).
  std::vector<torch::Tensor> run(const torch::Tensor& x, const torch::Tensor& y, const Body& body);

  // Call before the host reads anything a step wrote: waits until the last replay has finished,
  // at most the communicator's collective timeout, then aborts the process group and throws
  // CollectiveError naming `what`. (The communicator's own wait_host cannot see collectives
  // inside a graph.)
  void wait_host(const std::string& what);

  bool captured() const;
  int64_t replays() const;
  // The captured step's nodes (its kernels, copies and memsets: the launches one replay stands
  // for); -1 before the capture, and with a LibTorch older than 2.8, which cannot keep the graph.
  int64_t captured_nodes() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace dptrain
