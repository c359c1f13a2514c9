// The replica helpers (parallel/replicas.h: broadcast, checksum, buffer averaging) on the book's
// model (model/model.h), over thread ranks: tests that span the two layers.
#include <cstdint>
#include <gtest/gtest.h>
#include <chrono>
#include <functional>
#include <map>
#include <thread>
#include <utility>
#include "dptrain/core/errors.h"
#include "dptrain/model/model.h"
#include "dptrain/parallel/replicas.h"
#include "support/parallel_support.h"
#include "support/test_support.h"

namespace {

using namespace dptrain;
using dptrain::testing::run_thread_ranks;
using namespace std::chrono_literals;

TEST(Replicas, BroadcastMakesReplicasIdenticalAndChecksumAgrees) {
  run_thread_ranks(3, [](Communicator& c) {
    ResNet model(ResNetOptions{10, 1, 2});
    init_reference_weights(*model, /*seed=*/100 + static_cast<uint64_t>(c.rank()));
    {
      torch::NoGradGuard no_grad;
      model->named_buffers()["1.running_mean"].fill_(static_cast<float>(c.rank()));
    }
    EXPECT_THROW(check_replicas_identical(*model, c, 0), CollectiveError);
    broadcast_from_rank0(*model, c);
    check_replicas_identical(*model, c, 1);
    ResNet rank0(ResNetOptions{10, 1, 2});
    init_reference_weights(*rank0, 100);
    EXPECT_EQ(parameter_checksum(*model), parameter_checksum(*rank0));
    EXPECT_TRUE(torch::all(model->named_buffers()["1.running_mean"] == 0).item<bool>());
  });
}

TEST(Replicas, AverageBuffersTakesTheMean) {
  run_thread_ranks(2, [](Communicator& c) {
    ResNet model(ResNetOptions{10, 1, 2});
    {
      torch::NoGradGuard no_grad;
      model->named_buffers()["1.running_var"].fill_(c.rank() == 0 ? 1.0f : 3.0f);
    }
    average_buffers(*model, c);
    EXPECT_TRUE(torch::all(model->named_buffers()["1.running_var"] == 2.0f).item<bool>());
  });
}

TEST(Replicas, ChecksumSeesOneBit) {
  ResNet model(ResNetOptions{10, 1, 2});
  init_reference_weights(*model, 1);
  const auto before = parameter_checksum(*model);
  {
    torch::NoGradGuard no_grad;
    auto w = model->parameters().back();
    w.view(-1)[0] = std::nextafter(w.view(-1)[0].item<float>(), 1.0f);
  }
  EXPECT_NE(parameter_checksum(*model), before);
}

}  // namespace
