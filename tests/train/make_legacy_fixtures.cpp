// Writes tests/fixtures/checkpoints/: files of dptrain's older checkpoint format (DPTRNCKP,
// versions 1 and 2), made by the last dptrain that had a writer of that format, for the reader's
// tests. Run once, by hand:
//   dptrain_train_tests --gtest_also_run_disabled_tests --gtest_filter='MakeLegacyFixtures.*'
// The checkpoints are test_checkpoint.cpp's small_checkpoint and checkpoint_at, and the
// epoch-1 checkpoints of test_resume.cpp's runs.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <limits>
#include <string>

#include "dptrain/train/checkpoint.h"
#include "dptrain/train/train.h"
#include "support/test_support.h"
#include "support/train_support.h"

namespace {

using namespace dptrain;
using namespace dptrain::testing;

EpochStats stats_for_epoch(int64_t epoch) {
  EpochStats s;
  s.epoch = epoch;
  s.epochs = 7;
  s.train_loss = 2.302585092994046 / static_cast<double>(epoch);
  s.train_acc = 0.1 * static_cast<double>(epoch) + 1e-17;
  s.test_loss = -0.0;
  s.test_acc = std::nextafter(0.5, 1.0);
  s.seconds = 1e-300;
  s.images_per_second = 6.02214076e11;
  s.steps = 2 + epoch;
  return s;
}

Checkpoint small_checkpoint() {
  Checkpoint c;
  c.config = CheckpointConfig{4, 10, 1, 32, 0.05, 7, 256, 2, std::string(64, 'd')};
  c.epochs_done = 1;
  c.step_in_epoch = 3;
  c.global_step = 11;
  c.partial_sums = {6.5, 40, 96};
  c.partial_seconds = 0.25;
  c.history = {stats_for_epoch(1)};
  c.tensors.emplace_back("w", torch::tensor({1.5f, -2.0f, 3.25f}));
  c.tensors.emplace_back("n", torch::tensor(int64_t{42}, torch::kInt64));
  return c;
}

Checkpoint checkpoint_at(int64_t epochs_done, int64_t step) {
  auto c = small_checkpoint();
  c.config.train_size = 100 * c.config.batch_size;
  c.epochs_done = epochs_done;
  c.step_in_epoch = step;
  c.global_step = epochs_done * 100 + step;
  const double seen = static_cast<double>(step * c.config.batch_size);
  c.partial_sums = {seen > 0 ? 6.5 : 0.0, std::min(40.0, seen), seen};
  c.history.clear();
  for (int64_t epoch = 1; epoch <= epochs_done; ++epoch) {
    c.history.push_back(stats_for_epoch(1));
    c.history.back().epoch = epoch;
    c.history.back().epochs = std::max<int64_t>(epochs_done, 7);
  }
  return c;
}

TEST(MakeLegacyFixtures, DISABLED_Write) {
  const std::string out = std::string(DPTRAIN_TEST_DATA_DIR) + "/checkpoints";
  make_directories(out);
  const auto put = [&](const std::string& name, Checkpoint c, uint32_t version) {
    c.format_version = version;
    write_bytes(out + "/" + name, serialize_checkpoint(c));
  };
  put("small-v2.dpt", small_checkpoint(), 2);
  auto v1 = small_checkpoint();
  v1.config.train_digest.clear();
  put("small-v1.dpt", v1, 1);
  auto named = small_checkpoint();
  named.tensors.emplace_back("\x1b]0;evil\x07", torch::zeros({1}));
  put("small-v2-escaped-name.dpt", named, 2);
  auto bf16 = small_checkpoint();
  bf16.tensors.emplace_back(
      "b", torch::full({3}, std::numeric_limits<double>::quiet_NaN(), torch::kBFloat16));
  put("small-v2-bf16-nan.dpt", bf16, 2);
  auto variance = small_checkpoint();
  variance.tensors.emplace_back("1.running_var", torch::tensor({1.0f, -0.5f}));
  put("small-v2-negative-running-var.dpt", variance, 2);
  put("checkpoint-e0002-s000000.dpt", checkpoint_at(2, 0), 2);
  for (const int replicas : {1, 2}) {  // test_resume.cpp's resume_options, one epoch
    TempDir dir;
    TrainOptions options;
    options.epochs = 1;
    options.batch_size = 32;
    options.lr = 0.05;
    options.seed = 3;
    options.width = 4;
    options.threads = replicas;
    options.timeout = std::chrono::seconds(60);
    options.checkpoint_dir = dir.path();
    const auto run = train(synthetic_data(256, 128), options, cpu_world(replicas));
    ASSERT_TRUE(run.last_checkpoint.has_value());
    put("resume-" + std::to_string(replicas) + "-replica-e0001-s000000.dpt",
        read_checkpoint(*run.last_checkpoint), 2);
  }
}

}  // namespace
