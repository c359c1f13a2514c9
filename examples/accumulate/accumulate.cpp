// dptrain as a library: gradient accumulation. Each optimizer step takes K micro-batches; the
// first K-1 backward passes run inside no_sync() (local, nothing reduced) and the last one
// all-reduces the accumulated gradients once, as with PyTorch DDP's no_sync(). A LeNet-like CNN
// with BatchNorm, on Fashion-MNIST, stepped by DataParallel's own SGD (Nesterov momentum, weight
// decay off the biases and norms, gradient clipping: one fused update per bucket, equal to
// torch::optim::SGD's); examples/mlp_adam steps with a LibTorch optimizer instead. Under torchrun
// each process is a rank; `--replicas N` runs N replicas as threads of this one process.
// Not here: anything of the dptrain driver (checkpoints, metrics, the book's model).
#include <torch/torch.h>

#include <cstdint>
#include <cstdio>
#include <exception>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "dptrain/data/data.h"
#include "dptrain/parallel/data_parallel.h"
#include "dptrain/parallel/world.h"

struct LeNetImpl : torch::nn::Module {
  torch::nn::Sequential features{register_module("features", torch::nn::Sequential(
      torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 8, /*kernel_size=*/5)),   // (N, 8, 24, 24)
      torch::nn::BatchNorm2d(8), torch::nn::ReLU(), torch::nn::MaxPool2d(2),  // (N, 8, 12, 12)
      torch::nn::Conv2d(torch::nn::Conv2dOptions(8, 16, /*kernel_size=*/5)),  // (N, 16, 8, 8)
      torch::nn::ReLU(), torch::nn::MaxPool2d(2)))};                          // (N, 16, 4, 4)
  torch::nn::Linear classifier{register_module("classifier", torch::nn::Linear(16 * 4 * 4, 10))};
  torch::Tensor forward(const torch::Tensor& images) {  // (N, 1, 28, 28) -> (N, 10) logits
    return classifier(features->forward(images).flatten(1));
  }
};
TORCH_MODULE(LeNet);

struct Flags {
  int epochs = 1, replicas = 0;  // replicas 0: the launcher's world (torchrun)
  int micro_batch = 32, accumulate = 4;      // one step = `accumulate` micro-batches per rank
  int64_t train_limit = 0, test_limit = 0;   // 0: the whole split
  std::optional<std::string> data;           // else $DPTRAIN_DATA or Debian's folder
};

void train(dptrain::World& world, const dptrain::FashionMnist& data, const Flags& flags) {
  LeNet model;
  model->to(world.device());
  dptrain::DataParallelOptions options;
  options.sgd.momentum = 0.9;
  options.sgd.nesterov = true;
  options.sgd.weight_decay = 5e-4;
  options.sgd.weight_decay_skip_vectors = true;
  dptrain::DataParallel parallel(model, world, options);
  torch::data::samplers::DistributedRandomSampler sampler(data.train.size(), world.world_size(),
                                                          world.rank());
  for (int epoch = 0; epoch < flags.epochs; ++epoch) {
    sampler.set_epoch(epoch);
    sampler.reset();
    while (auto indices = sampler.next(flags.micro_batch * flags.accumulate)) {
      auto index = torch::tensor(std::vector<int64_t>(indices->begin(), indices->end()));
      auto images = dptrain::to_model_input(data.train.images.index_select(0, index));
      auto micro_images = images.to(world.device()).split(flags.micro_batch);
      auto micro_labels = data.train.labels.index_select(0, index).to(world.device())
                              .split(flags.micro_batch);
      parallel.zero_grad();
      const auto count = static_cast<int64_t>(micro_images.size());
      for (int64_t k = 0; k < count; ++k) {
        // Each micro-batch's mean loss over K: the step's gradient is the mean over all of them.
        auto loss = torch::nn::functional::cross_entropy(model(micro_images[k]), micro_labels[k]) /
                    static_cast<double>(count);
        if (k + 1 < count) {
          auto no_sync = parallel.no_sync();  // accumulate locally, reduce nothing
          parallel.backward(loss);
        } else {
          parallel.backward(loss);  // reduces the K micro-batches' sum once
        }
      }
      parallel.clip_grad_norm(5.0);  // on the reduced gradients, the same on every rank
      parallel.sgd_step(0.05);
    }
  }
  parallel.average_buffers();  // BatchNorm's running statistics: the ranks' mean
  torch::NoGradGuard no_grad;
  model->eval();
  auto images = dptrain::to_model_input(data.test.images).to(world.device());
  auto correct = model(images).argmax(1).eq(data.test.labels.to(world.device())).sum();
  if (world.rank() == 0)
    std::printf("test acc: %.4f\n", correct.item<double>() / static_cast<double>(data.test.size()));
}

int main(int argc, char** argv) try {
  Flags flags;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string name = argv[i], value = argv[i + 1];
    if (name == "--epochs") flags.epochs = std::stoi(value);
    else if (name == "--replicas") flags.replicas = std::stoi(value);
    else if (name == "--accumulate") flags.accumulate = std::stoi(value);
    else if (name == "--train-limit") flags.train_limit = std::stoll(value);
    else if (name == "--test-limit") flags.test_limit = std::stoll(value);
    else if (name == "--data") flags.data = value;
    else throw std::invalid_argument("unknown flag " + name);
  }
  torch::manual_seed(0);
  auto data = dptrain::load_fashion_mnist(dptrain::resolve_data_dir(flags.data),
                                          flags.train_limit, flags.test_limit);
  if (flags.replicas > 0) {
    dptrain::run_replicas(std::vector<torch::Device>(flags.replicas, torch::kCPU),
                          [&](dptrain::World& world) { train(world, data, flags); });
  } else {
    auto world = dptrain::World::from_environment();
    train(world, data, flags);
    world.leave();
  }
} catch (const std::exception& e) {
  std::fprintf(stderr, "error: %s\n", e.what());
  return 1;
}
