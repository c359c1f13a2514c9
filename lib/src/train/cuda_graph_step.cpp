// The graphed training step: warm-up, capture and replay of one CUDA graph, and the checks of
// where --cuda-graph may run. See cuda_graph_step.h. A build without CUDA, or configured with
// -DDPTRAIN_CUDA_GRAPH=OFF (the GPU check's last build retry, should this file's CUDA branch not
// compile there), compiles the checks only; the class then refuses to be made (check_cuda_graph
// has refused the flag before).
#include "dptrain/train/cuda_graph_step.h"

#include <chrono>  // IWYU pragma: keep (the graph branch)
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <stdexcept>  // IWYU pragma: keep (the graph branch)
#include <string>
#include <thread>  // IWYU pragma: keep (the graph branch)
#include <utility>  // IWYU pragma: keep (the graph branch)
#include <vector>

#include "dptrain/core/devices.h"
#include "dptrain/core/errors.h"
#include "dptrain/parallel/distributed.h"
#include "dptrain/parallel/world_plan.h"
#include "dptrain/train/lr_schedule.h"
#include "dptrain/train/options.h"

// DPTRAIN_WITH_CUDA_GRAPH is set for this file alone (lib/CMakeLists.txt), so that turning the
// graph off recompiles nothing else.
#if defined(DPTRAIN_WITH_CUDA) && defined(DPTRAIN_WITH_CUDA_GRAPH)
#define DPTRAIN_GRAPH_CODE 1
#endif

#if defined(DPTRAIN_GRAPH_CODE)
#include <ATen/autocast_mode.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <torch/version.h>

#include "cuda_event.h"
#endif

namespace dptrain {

bool cuda_graph_available() {
#if defined(DPTRAIN_GRAPH_CODE)
  return true;
#else
  return false;
#endif
}

void check_cuda_graph(const TrainOptions& options, const WorldPlan& world, bool cuda_built) {
  if (!options.cuda_graph) return;
  if (!lr_is_constant(options.recipe.schedule) || options.recipe.ema_decay != 0) {
    throw UsageError(
        "--cuda-graph replays one captured update, its learning rate baked in, and no moving "
        "average of the weights: run --lr-schedule, --warmup-epochs or --ema without --cuda-graph");
  }
  for (const auto& device : world.local_devices) {
    if (!device.is_cuda()) {
      throw UsageError("--cuda-graph needs CUDA devices: a CUDA graph replays GPU work, and " +
                       device_name(device) + " is not a GPU; run without --cuda-graph");
    }
  }
  if (!cuda_built) {
    throw UsageError(
        "--cuda-graph: this build of dptrain has no CUDA graphs (they need a CUDA LibTorch at "
        "build time and are left out by -DDPTRAIN_CUDA_GRAPH=OFF); run without --cuda-graph");
  }
  const bool communicates = world.world_size > 1 || options.process_group_for_one;
  if (options.backend == Backend::kNccl && communicates) {
    // With blocking wait, ProcessGroupNCCL's wait() queries the collective's CUDA event, and
    // for a collective recorded inside the capture that query invalidates the capture (CUDA
    // refuses to query events of a capturing stream): the run would fail at its first capture.
    // The variables are read as c10d reads them (nccl_blocking_wait).
    const NcclBlockingWait blocking = nccl_blocking_wait(std::getenv);
    if (blocking.on) {
      throw UsageError("--cuda-graph over NCCL cannot run with " + blocking.name + "=" +
                       blocking.value +
                       ": blocking wait queries the events of collectives recorded inside the "
                       "graph's capture, which breaks it; unset " +
                       blocking.name +
                       " (dptrain bounds every wait by --timeout itself) or run without "
                       "--cuda-graph");
    }
  }
  if (options.backend == Backend::kGloo && communicates) {
    throw UsageError(
        "--cuda-graph cannot capture Gloo's collectives (they run on the host, outside any CUDA "
        "stream); use --backend nccl with one process per GPU, or run without --cuda-graph");
  }
  if (world.local_devices.size() > 1) {
    const auto n = std::to_string(world.local_devices.size());
    throw UsageError("--cuda-graph with " + n +
                     " GPUs in one process: NCCL collectives captured in CUDA graphs may "
                     "deadlock with several GPUs per process; run one process per GPU (torchrun "
                     "--nproc-per-node=" +
                     n + " --no-python dptrain train --cuda-graph ...)");
  }
}

// Note [Capturing the whole step]
// A CUDA graph records the kernels one step launches, with their arguments and addresses, and
// replays them with one launch: ~700 kernel launches of a bf16 step at batch 256 become one.
// What is captured is exactly what runs, so the rules follow PyTorch's notes on whole-network
// capture (torch.cuda.graphs, "Whole-network capture" and "Usage with DistributedDataParallel"):
// - One stream for everything: the warm-up, the capture and every replay and eager step run on
//   a side stream of this object (never the legacy default stream, which cannot be captured),
//   forked from and joined back to the caller's stream. cuBLAS keeps a handle and workspace per
//   stream, created on first use: warming up on the capture stream creates them outside it.
// - Autograd runs each AccumulateGrad on the stream current when it was made, and the reducer
//   makes them (and keeps them) when it is constructed: the reducer is made on this stream
//   (on_graph_stream), as PyTorch asks DDP to be, or backward's last kernels would land on the
//   default stream and break the capture.
// - Warm-up first: kCudaGraphWarmupSteps full batches run eagerly on the stream, so cuDNN's
//   benchmark has timed its algorithms for this shape (no timing inside a capture), lazy handles
//   exist and NCCL's communicator is initialised. ProcessGroupNCCL makes a communicator lazily,
//   at its first collective on a device: in a world of several ranks that is the start's
//   broadcast of rank 0's weights; in a world of one that broadcast has nothing to send and
//   returns early, so the first warm-up step's all-reduce makes it. Either way it exists
//   before the capture, whose thread may not create one.
// - Static addresses: the inputs are copied into buffers of this object before each replay; the
//   outputs of the captured body (the loss sum and logits) live in the graph's private memory
//   pool and every replay rewrites them. The parameters, their gradients (views into the
//   reducer's buckets, zeroed in place, never set undefined) and the BatchNorm statistics are
//   never reallocated after the capture: the SGD update is an in-place add per bucket, the
//   non-finite restore, the averaging before checkpoints and evaluation are in-place copy_ and
//   div_, and a resume loads its weights before the reducer and this object exist.
// - Nothing inside reads the host: the loss and accuracy sums are tallied on the device after
//   the replay, the non-finite check reads the gradients after it (kSkip's host read and update
//   stay outside the graph, rank.cpp), and the reducer's waits on NCCL only order streams. The
//   learning rate is baked into the graph as a constant: dptrain's is constant (the book's
//   recipe); a schedule would need it in a device tensor.
// - Autocast's weight-cast cache is off during the capture, so the bf16 copies of the weights
//   are cast by kernels inside the graph on every replay and never taken from a cache filled by
//   an earlier step (the cache is cleared after every forward anyway, autocast.cpp).
// - The capture is in thread-local mode: NCCL's watchdog thread may still query the events of
//   earlier collectives during it, which global mode would turn into a failed capture; our
//   thread may not call anything unsafe. Autograd's device thread runs backward into the
//   capture: work queued on a capturing stream is captured whichever thread queues it.
// - NCCL inside a graph wants one GPU per process: "Using multiple GPUs per process with CUDA
//   graph capture may result in deadlocks" (NCCL's user guide, "Using NCCL with CUDA Graphs"),
//   so check_cuda_graph refuses replicas in threads. Whether a collective is captured must be
//   the same on every rank, so --cuda-graph is one of the settings the ranks compare.
// - ProcessGroupNCCL does not hand captured collectives to its watchdog (their events were
//   recorded during the capture, and CUDA refuses to query such events), and the
//   communicator's wait_host would query the last of them: so one eager collective follows the
//   capture, and wait_host() here bounds the wait for a replay by the timeout instead.
// - The last, smaller batch of an epoch runs eagerly on the same stream, allocating from the
//   ordinary pool; its outputs are marked as used by the caller's stream.

#if defined(DPTRAIN_GRAPH_CODE)

namespace {

std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

// Makes `waiter` wait for the work queued so far on `done`.
void order_after(const c10::cuda::CUDAStream& waiter, const c10::cuda::CUDAStream& done) {
  CudaEvent event;
  event.record(done);
  event.block(waiter);
}

// Autocast's weight-cast cache off in this thread while it lives.
class AutocastCacheOff {
 public:
  AutocastCacheOff() : was_(at::autocast::is_autocast_cache_enabled()) {
    at::autocast::set_autocast_cache_enabled(false);
  }
  ~AutocastCacheOff() { at::autocast::set_autocast_cache_enabled(was_); }
  AutocastCacheOff(const AutocastCacheOff&) = delete;
  AutocastCacheOff& operator=(const AutocastCacheOff&) = delete;

 private:
  bool was_;
};

}  // namespace

struct CudaGraphStep::State {
  State(const torch::Device& device, Communicator& communicator, int64_t full_rows,
        int64_t warmup_steps)
      : device(device),
        communicator(communicator),
        full_rows(full_rows),
        warmup_steps(warmup_steps),
        stream(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index())) {}

  torch::Device device;
  Communicator& communicator;
  int64_t full_rows;             // the shard size of a full batch: the only size captured
  int64_t warmup_steps;          // eager full batches before the capture
  c10::cuda::CUDAStream stream;  // warm-up, capture, replays and eager steps
  std::unique_ptr<at::cuda::CUDAGraph> graph;
  torch::Tensor static_x;                     // (full_rows, 1, 28, 28), the replays' input
  torch::Tensor static_y;                     // (full_rows), their labels
  std::vector<torch::Tensor> static_outputs;  // what the captured body returned
  CudaEvent replayed;                         // recorded after each replay
  int64_t warmed = 0;                         // eager full batches so far
  int64_t replays = 0;
  int64_t nodes = -1;  // the captured graph's nodes, where known

  c10::cuda::CUDAStream caller() const { return c10::cuda::getCurrentCUDAStream(device.index()); }

  // `body` on this stream, ordered between the caller's work before and after.
  std::vector<torch::Tensor> eager(const torch::Tensor& x, const torch::Tensor& y,
                                   const Body& body) {
    const auto before = caller();
    order_after(stream, before);
    std::vector<torch::Tensor> outputs;
    {
      const c10::cuda::CUDAStreamGuard on_stream(stream);
      outputs = body(x, y);
    }
    order_after(before, stream);
    // Allocated on this stream, read on the caller's: not reused before the caller is done.
    for (auto& t : outputs) {
      if (t.defined() && t.is_cuda()) t.record_stream(before);
    }
    return outputs;
  }

  // Captures `body` on the static inputs, holding x and y, then replays it once: the capture
  // itself runs nothing.
  void capture(const torch::Tensor& x, const torch::Tensor& y, const Body& body) {
    // Nothing of ours in flight: every eager collective finished (bounded by the timeout).
    communicator.wait_host("the CUDA graph's capture");
    c10::cuda::device_synchronize();
    static_x = torch::empty_like(x);  // keeps x's layout (channels-last or not)
    static_y = torch::empty_like(y);
    const auto before = caller();
    order_after(stream, before);
    {
      const c10::cuda::CUDAStreamGuard on_stream(stream);
      static_x.copy_(x);
      static_y.copy_(y);
      // LibTorch 2.8 and later can keep the captured graph until instantiate(), long enough to
      // count its nodes (CUDAGraph's keep_graph); earlier ones destroy it in capture_end().
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 8)
      graph = std::make_unique<at::cuda::CUDAGraph>(/*keep_graph=*/true);
#else
      graph = std::make_unique<at::cuda::CUDAGraph>();
#endif
      try {
        const AutocastCacheOff no_cache;
        graph->capture_begin({0, 0}, cudaStreamCaptureModeThreadLocal);
        try {
          static_outputs = body(static_x, static_y);
        } catch (...) {
          try {
            graph->capture_end();  // take the stream out of capture mode
          } catch (const std::exception&) {
            // The body's error is the one to report.
          }
          throw;
        }
        graph->capture_end();
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 8)
        size_t count = 0;
        C10_CUDA_CHECK(cudaGraphGetNodes(graph->raw_cuda_graph(), nullptr, &count));
        nodes = static_cast<int64_t>(count);
        graph->instantiate();
#endif
      } catch (const c10::Error& e) {
        graph.reset();
        static_outputs.clear();
        throw std::runtime_error("--cuda-graph: the training step could not be captured (" +
                                 first_line(e.what_without_backtrace()) +
                                 "); run without --cuda-graph");
      } catch (...) {
        graph.reset();
        static_outputs.clear();
        throw;
      }
      graph->replay();
      replayed.record(stream);
    }
    order_after(before, stream);
    // An eager collective after the captured ones, so that the communicator's wait_host never
    // queries an event recorded during the capture (Note [Capturing the whole step]).
    if (communicator.has_process_group()) {
      auto agreed = torch::zeros({1}, torch::dtype(torch::kInt64).device(device));
      communicator.allreduce_max(agreed, "the collective after the CUDA graph's capture");
    }
  }

  std::vector<torch::Tensor> replay(const torch::Tensor& x, const torch::Tensor& y) {
    const auto before = caller();
    order_after(stream, before);  // the gathered batch, and the last step's readers
    {
      const c10::cuda::CUDAStreamGuard on_stream(stream);
      static_x.copy_(x);
      static_y.copy_(y);
      graph->replay();
      replayed.record(stream);
    }
    order_after(before, stream);
    ++replays;
    return static_outputs;
  }
};

CudaGraphStep::CudaGraphStep(const torch::Device& device, Communicator& communicator,
                             int64_t full_rows, int64_t warmup_steps) {
  TORCH_CHECK(device.is_cuda(), "CudaGraphStep needs a CUDA device, not ", device);
  TORCH_CHECK(full_rows > 0 && warmup_steps >= 1, "CudaGraphStep: bad sizes");
  const torch::Device indexed(torch::kCUDA,
                              device.has_index() ? device.index() : c10::cuda::current_device());
  const c10::cuda::CUDAGuard on_device(indexed.index());
  state_ = std::make_unique<State>(indexed, communicator, full_rows, warmup_steps);
}

CudaGraphStep::~CudaGraphStep() = default;

void CudaGraphStep::on_graph_stream(const std::function<void()>& make) {
  auto& s = *state_;
  const auto before = s.caller();
  order_after(s.stream, before);
  {
    const c10::cuda::CUDAStreamGuard on_stream(s.stream);
    make();
  }
  order_after(before, s.stream);
}

std::vector<torch::Tensor> CudaGraphStep::run(const torch::Tensor& x, const torch::Tensor& y,
                                              const Body& body) {
  auto& s = *state_;
  if (x.size(0) != s.full_rows) return s.eager(x, y, body);
  if (s.graph) return s.replay(x, y);
  if (s.warmed < s.warmup_steps) {
    ++s.warmed;
    return s.eager(x, y, body);
  }
  s.capture(x, y, body);
  ++s.replays;
  return s.static_outputs;
}

void CudaGraphStep::wait_host(const std::string& what) {
  auto& s = *state_;
  if (s.replays == 0 || !s.communicator.has_process_group()) return;
  const auto deadline = std::chrono::steady_clock::now() + s.communicator.collective_timeout();
  while (!s.replayed.query()) {
    if (std::chrono::steady_clock::now() >= deadline) {
      s.communicator.abort();  // kernels waiting for a peer end, and peers waiting for us fail
      throw CollectiveError("rank " + std::to_string(s.communicator.rank()) + " of " +
                            std::to_string(s.communicator.world_size()) +
                            ": the CUDA graph's step (its gradient all-reduces) did not finish "
                            "within the timeout (awaited before " +
                            what + "); a rank may have stopped");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

bool CudaGraphStep::captured() const { return state_->graph != nullptr; }
int64_t CudaGraphStep::replays() const { return state_->replays; }
int64_t CudaGraphStep::captured_nodes() const { return state_->nodes; }

#else  // no CUDA graphs: check_cuda_graph refuses the flag before anything is made

struct CudaGraphStep::State {};

CudaGraphStep::CudaGraphStep(const torch::Device& /*device*/, Communicator& /*communicator*/,
                             int64_t /*full_rows*/, int64_t /*warmup_steps*/) {
  throw UsageError(
      "--cuda-graph: this build of dptrain has no CUDA graphs; run without --cuda-graph");
}
CudaGraphStep::~CudaGraphStep() = default;
void CudaGraphStep::on_graph_stream(const std::function<void()>& make) { make(); }
std::vector<torch::Tensor> CudaGraphStep::run(const torch::Tensor& x, const torch::Tensor& y,
                                              const Body& body) {
  return body(x, y);
}
void CudaGraphStep::wait_host(const std::string& /*what*/) {}
bool CudaGraphStep::captured() const { return false; }
int64_t CudaGraphStep::replays() const { return 0; }
int64_t CudaGraphStep::captured_nodes() const { return -1; }

#endif

}  // namespace dptrain
