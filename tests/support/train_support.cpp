// Test helpers that need the train layer; see train_support.h.
#include "support/train_support.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <cstdint>

#include "dptrain/train/checked_world.h"
#include "dptrain/train/checkpoint.h"
#include "dptrain/train/checkpoint_directory.h"
#include "support/cli_support.h"

namespace dptrain::testing {

TrainResult train(const FashionMnist& data, const TrainOptions& options, const WorldPlan& world,
                  const TrainCallbacks& callbacks) {
  return dptrain::train(data, check_world(options, world), callbacks);
}

TrainResult train(const FashionMnist& data, const TrainOptions& options, const WorldPlan& world,
                  const EpochCallback& on_epoch, const StepCallback& on_step) {
  TrainCallbacks callbacks;
  callbacks.on_epoch = on_epoch;
  callbacks.on_step = on_step;
  return train(data, options, world, callbacks);
}

EvalResult evaluate_weights(const FashionMnist& data, const TrainOptions& options,
                            const WorldPlan& world,
                            const std::vector<std::pair<std::string, torch::Tensor>>& weights,
                            const std::string& name) {
  return dptrain::evaluate_weights(data, check_world(options, world), weights, options.width,
                                   name);
}

void load_model_file(ResNet& model, const std::string& path) {
  load_model_tensors(*model, read_checkpoint(path, "--model").tensors, path);
}

std::vector<uint8_t> header_claiming(Checkpoint checkpoint, uint64_t data_bytes) {
  checkpoint.tensors = {{"huge", torch::zeros({1}, torch::kFloat64)}};
  const auto file = serialize_checkpoint(checkpoint);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t{file[i]} << (8 * i);
  std::string header(file.begin() + 8, file.begin() + 8 + static_cast<long>(n));
  const std::string one = "\"shape\":[1],\"data_offsets\":[0,8]";
  const uint64_t count = data_bytes / 8;
  header.replace(header.find(one), one.size(),
                 "\"shape\":[" + std::to_string(count) + "],\"data_offsets\":[0," +
                     std::to_string(count * 8) + "]");
  while (header.size() % 8 != 0) header += ' ';
  std::vector<uint8_t> bytes(8);
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<uint8_t>(header.size() >> (8 * i));
  bytes.insert(bytes.end(), header.begin(), header.end());
  return bytes;
}

void expect_signal_stops_and_saves(int signal_number, std::vector<std::string> train_args) {
  SCOPED_TRACE("signal " + std::to_string(signal_number));
  TempDir dir;
  const std::string checkpoints = dir.file("ck");
  train_args.insert(train_args.end(), {"--checkpoint-dir", checkpoints, "--log-every", "1"});
  const auto child = spawn_command(binary_and(train_args), {}, dir.file("run"));
  ASSERT_TRUE(wait_for_text(child.err_path, " step ")) << read_text(child.err_path);
  ASSERT_EQ(kill(child.pid, signal_number), 0);
  const auto result = wait_command(child, 60);
  EXPECT_EQ(result.exit_code, 128 + signal_number) << describe(result);
  EXPECT_TRUE(contains(result.err, "dptrain: stopped by signal " + std::to_string(signal_number) +
                                       "; resume from " + checkpoints))
      << describe(result);
  EXPECT_EQ(checkpoint_file_names(checkpoints).size(), 1u) << describe(result);
}

}  // namespace dptrain::testing
