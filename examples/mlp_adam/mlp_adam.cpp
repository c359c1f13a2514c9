// dptrain as a library: a small MLP (not the driver's ResNet) trained data-parallel on
// Fashion-MNIST with Adam and a step learning-rate schedule. Under torchrun each process is a
// rank; `--replicas N` runs N replicas as threads of this one process instead.
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

struct MlpImpl : torch::nn::Module {
  torch::nn::Linear hidden{register_module("hidden", torch::nn::Linear(28 * 28, 256))};
  torch::nn::Linear output{register_module("output", torch::nn::Linear(256, 10))};
  torch::Tensor forward(const torch::Tensor& images) {  // (N, 1, 28, 28) float in [0, 1]
    return output(torch::relu(hidden(images.flatten(1))));  // (N, 256) -> (N, 10) logits
  }
};
TORCH_MODULE(Mlp);

struct Flags {
  int epochs = 2, replicas = 0, batch = 64;  // replicas 0: the launcher's world (torchrun)
  int64_t train_limit = 0, test_limit = 0;   // 0: the whole split
  std::optional<std::string> data;           // else $DPTRAIN_DATA or Debian's folder
};

void train(dptrain::World& world, const dptrain::FashionMnist& data, const Flags& flags) {
  Mlp model;
  model->to(world.device());
  dptrain::DataParallel parallel(model, world);  // rank 0's weights on every rank
  torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(1e-3));
  torch::optim::StepLR schedule(optimizer, /*step_size=*/1, /*gamma=*/0.5);
  // This rank's shard, reshuffled each epoch: the same permutation on every rank (seeded by the
  // epoch), so the shards never overlap and every rank takes the same number of steps.
  torch::data::samplers::DistributedRandomSampler sampler(data.train.size(), world.world_size(),
                                                          world.rank());
  for (int epoch = 0; epoch < flags.epochs; ++epoch) {
    sampler.set_epoch(epoch);
    sampler.reset();
    while (auto indices = sampler.next(flags.batch)) {
      auto index = torch::tensor(std::vector<int64_t>(indices->begin(), indices->end()));
      auto images = dptrain::to_model_input(data.train.images.index_select(0, index));
      auto labels = data.train.labels.index_select(0, index).to(world.device());
      optimizer.zero_grad();
      auto loss = torch::nn::functional::cross_entropy(model(images.to(world.device())), labels);
      parallel.backward(loss);  // every .grad is now the ranks' mean
      optimizer.step();
    }
    schedule.step();
  }
  parallel.average_buffers();  // none in an MLP; BatchNorm's running statistics would be
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
