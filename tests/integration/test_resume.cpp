// Tests of checkpoints in training (train.h): a run stopped and resumed, at an epoch boundary or
// mid-epoch by a stop request, ends bit-identical to an uninterrupted one; a resume that would
// not continue the same run is refused; non-finite steps stop or are skipped; evaluate_weights
// reproduces the training's own evaluation. In process, on small synthetic data.
// Not here: the file format (test_checkpoint.cpp) and the signals themselves (test_binary_runs.cpp).
#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dptrain/core/errors.h"
#include "dptrain/core/files.h"
#include "dptrain/train/checkpoint.h"
#include "dptrain/train/checkpoint_directory.h"
#include "dptrain/train/checkpoint_types.h"
#include "dptrain/train/recipe.h"
#include "dptrain/train/train.h"
#include "support/test_support.h"
#include "support/train_support.h"

namespace {

using namespace dptrain;
using namespace dptrain::testing;

// ---- Helpers ------------------------------------------------------------------------------

constexpr int64_t kTrainExamples = 256;
constexpr int64_t kTestExamples = 128;
constexpr int64_t kBatch = 32;
constexpr int64_t kStepsPerEpoch = kTrainExamples / kBatch;  // 8

// Random images and labels: enough to compare runs with each other, no files needed.
const FashionMnist& resume_data() {
  static const FashionMnist data = dptrain::testing::synthetic_data(kTrainExamples, kTestExamples);
  return data;
}

TrainOptions resume_options(int replicas, const std::string& checkpoint_dir) {
  TrainOptions options;
  options.epochs = 2;
  options.batch_size = kBatch;
  options.lr = 0.05;
  options.seed = 3;
  options.width = 4;
  options.threads = replicas;  // one intra-op thread per replica
  options.timeout = std::chrono::seconds(60);
  options.checkpoint_dir = checkpoint_dir;
  return options;
}

// The tensors of two checkpoints by name: parameters bit for bit, and the BatchNorm running
// statistics too unless `running_tolerance` (relative) allows float rounding.
void expect_same_tensors(const Checkpoint& a, const Checkpoint& b, double running_tolerance = 0) {
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  int differing = 0;
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    const auto& [name, x] = a.tensors[i];
    const auto& y = b.tensors[i].second;
    EXPECT_EQ(name, b.tensors[i].first);
    if (torch::equal(x, y)) continue;
    const double difference =
        (x.to(torch::kFloat64) - y.to(torch::kFloat64)).abs().max().item<double>();
    const double scale = x.to(torch::kFloat64).abs().max().item<double>();
    if (name.find("running_") != std::string::npos && difference <= running_tolerance * scale) {
      continue;
    }
    ++differing;
    ADD_FAILURE() << "tensor " << name << " differs by up to " << difference << " (of " << scale
                  << ")";
  }
  EXPECT_EQ(differing, 0);
}

// The figures of each epoch: exact, or the losses to `loss_tolerance` where float sums are
// regrouped.
void expect_same_epochs(const std::vector<EpochStats>& a, const std::vector<EpochStats>& b,
                        double loss_tolerance) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    SCOPED_TRACE("epoch " + std::to_string(i + 1));
    EXPECT_EQ(a[i].epoch, b[i].epoch);
    EXPECT_EQ(a[i].steps, b[i].steps);
    if (loss_tolerance == 0) {
      EXPECT_EQ(a[i].train_loss, b[i].train_loss);
      EXPECT_EQ(a[i].test_loss, b[i].test_loss);
    } else {
      EXPECT_NEAR(a[i].train_loss, b[i].train_loss, loss_tolerance);
      EXPECT_NEAR(a[i].test_loss, b[i].test_loss, loss_tolerance);
    }
    EXPECT_EQ(a[i].train_acc, b[i].train_acc);
    EXPECT_EQ(a[i].test_acc, b[i].test_acc);
  }
}

void expect_usage_error(const std::function<void()>& body, const std::vector<std::string>& parts) {
  dptrain::testing::expect_throws<UsageError>(body, parts);
}

class Resume : public ::testing::TestWithParam<int> {
 protected:
  int replicas() const { return GetParam(); }
  // The uninterrupted two-epoch run every resumed run is compared with.
  void run_straight() {
    auto options = resume_options(replicas(), straight_dir_.path());
    straight_ = train(resume_data(), options, cpu_world(replicas()));
    ASSERT_EQ(straight_.epochs.size(), 2u);
    ASSERT_EQ(straight_.last_checkpoint, straight_dir_.file(checkpoint_file_name(2, 0)));
    straight_final_ = read_checkpoint(*straight_.last_checkpoint);
  }
  TempDir straight_dir_, dir_;
  TrainResult straight_;
  Checkpoint straight_final_;
};

std::string replicas_name(const ::testing::TestParamInfo<int>& info) {
  return info.param == 1 ? "OneReplica" : std::to_string(info.param) + "Replicas";
}

// ---- Resuming at an epoch boundary ----------------------------------------------------------

TEST_P(Resume, AtAnEpochBoundaryEndsBitIdentical) {
  ASSERT_NO_FATAL_FAILURE(run_straight());
  auto options = resume_options(replicas(), dir_.path());
  options.epochs = 1;
  const auto first = train(resume_data(), options, cpu_world(replicas()));
  const std::string boundary = dir_.file(checkpoint_file_name(1, 0));
  ASSERT_EQ(first.last_checkpoint, boundary);
  EXPECT_FALSE(first.resumed_from.has_value());

  options.epochs = 2;
  options.resume = true;
  const auto second = train(resume_data(), options, cpu_world(replicas()));
  EXPECT_EQ(second.resumed_from, boundary);
  EXPECT_EQ(second.stopped_by, 0);
  ASSERT_EQ(second.last_checkpoint, dir_.file(checkpoint_file_name(2, 0)));

  const auto final_checkpoint = read_checkpoint(*second.last_checkpoint);
  expect_same_tensors(straight_final_, final_checkpoint);
  EXPECT_EQ(final_checkpoint.global_step, 2 * kStepsPerEpoch);
  EXPECT_EQ(final_checkpoint.global_step, straight_final_.global_step);
  // Epoch 1 comes from the checkpoint's history, epoch 2 was run again: both as straight.
  expect_same_epochs(straight_.epochs, second.epochs, 0);
  expect_same_epochs(straight_.epochs, final_checkpoint.history, 0);
  EXPECT_EQ(checkpoint_file_names(dir_.path()),
            (std::vector<std::string>{checkpoint_file_name(1, 0), checkpoint_file_name(2, 0)}));
}

// A directory an older dptrain wrote (format version 2, ".dpt": this run's epoch-1 checkpoint as
// that dptrain wrote it, tests/fixtures/checkpoints) resumes, says so once, gains version 3 files
// beside the old one, and ends bit-identical to the resume from the same checkpoint in version 3
// (which the tests above hold to the uninterrupted run).
TEST_P(Resume, FromAnOlderFormatCheckpointEndsBitIdentical) {
  const std::string fixture = std::string(DPTRAIN_TEST_DATA_DIR) + "/checkpoints/resume-" +
                              std::to_string(replicas()) + "-replica-e0001-s000000.dpt";
  auto same = read_checkpoint(fixture);
  ASSERT_EQ(same.format_version, 2u);
  same.format_version = kCheckpointFormatVersion;
  write_checkpoint_atomically(same, straight_dir_.file(checkpoint_file_name(1, 0)));
  auto options = resume_options(replicas(), straight_dir_.path());
  options.resume = true;
  const auto from_version_3 = train(resume_data(), options, cpu_world(replicas()));
  ASSERT_EQ(from_version_3.resumed_from, straight_dir_.file(checkpoint_file_name(1, 0)));
  const std::string old_path = dir_.file("checkpoint-e0001-s000000.dpt");
  write_bytes(old_path, read_regular_file(fixture, "fixture"));

  options.checkpoint_dir = dir_.path();
  std::vector<std::string> notices;
  TrainCallbacks callbacks;
  callbacks.on_notice = [&](const std::string& text) { notices.push_back(text); };
  const auto second = train(resume_data(), options, cpu_world(replicas()), callbacks);
  EXPECT_EQ(second.resumed_from, old_path);
  const auto said = std::count_if(notices.begin(), notices.end(), [](const std::string& n) {
    return n.find("format version 2 (DPTRNCKP), read") != std::string::npos;
  });
  EXPECT_EQ(said, 1) << ::testing::PrintToString(notices);
  ASSERT_EQ(second.last_checkpoint, dir_.file(checkpoint_file_name(2, 0)));
  const auto final_checkpoint = read_checkpoint(*second.last_checkpoint);
  EXPECT_EQ(final_checkpoint.format_version, kCheckpointFormatVersion);
  expect_same_tensors(read_checkpoint(*from_version_3.last_checkpoint), final_checkpoint);
  expect_same_epochs(from_version_3.epochs, second.epochs, 0);
  EXPECT_EQ(checkpoint_file_names(dir_.path()),
            (std::vector<std::string>{"checkpoint-e0001-s000000.dpt", checkpoint_file_name(2, 0)}));
}

// ---- A stop request mid-epoch, and the resume ------------------------------------------------

TEST_P(Resume, StopMidEpochWritesACheckpointAndTheResumeEndsBitIdentical) {
  ASSERT_NO_FATAL_FAILURE(run_straight());
  constexpr int64_t kStopAt = 3;
  auto options = resume_options(replicas(), dir_.path());
  std::atomic<int> stop{0};
  options.stop_signal = &stop;
  double loss_sum = 0;  // the shard losses of rank 0 so far, as sums
  const auto stopping =
      train(resume_data(), options, cpu_world(replicas()), nullptr, [&](const StepStats& s) {
        loss_sum += s.shard_loss * static_cast<double>(kBatch / replicas());
        if (s.epoch == 1 && s.step == kStopAt) stop = SIGINT;
      });
  EXPECT_EQ(stopping.stopped_by, SIGINT);
  EXPECT_TRUE(stopping.epochs.empty());
  const std::string middle = dir_.file(checkpoint_file_name(0, kStopAt));
  ASSERT_EQ(stopping.last_checkpoint, middle);
  EXPECT_EQ(checkpoint_file_names(dir_.path()),
            std::vector<std::string>{checkpoint_file_name(0, kStopAt)});

  const auto saved = read_checkpoint(middle);
  EXPECT_EQ(saved.epochs_done, 0);
  EXPECT_EQ(saved.step_in_epoch, kStopAt);
  EXPECT_EQ(saved.global_step, kStopAt);
  EXPECT_TRUE(saved.history.empty());
  EXPECT_EQ(saved.partial_sums.count, static_cast<double>(kStopAt * kBatch));
  EXPECT_EQ(saved.partial_sums.correct, std::floor(saved.partial_sums.correct));  // a count
  EXPECT_LE(saved.partial_sums.correct, saved.partial_sums.count);
  if (replicas() == 1) {
    // shard_loss * 32 undoes an exact division by a power of two: the same float64 sum.
    EXPECT_EQ(saved.partial_sums.loss_sum, loss_sum);
  }
  EXPECT_GT(saved.partial_seconds, 0);

  stop = 0;
  options.resume = true;
  const auto resumed = train(resume_data(), options, cpu_world(replicas()));
  EXPECT_EQ(resumed.resumed_from, middle);
  EXPECT_EQ(resumed.stopped_by, 0);
  ASSERT_EQ(resumed.last_checkpoint, dir_.file(checkpoint_file_name(2, 0)));
  const auto final_checkpoint = read_checkpoint(*resumed.last_checkpoint);
  // One replica resumes exactly. Several replicas each track their own BatchNorm statistics
  // mid-epoch, and the checkpoint holds their mean: the mean at the epoch's end is the same
  // up to float rounding (saving rank 0's alone moved it by 2e-4), and with it the test loss.
  // The parameters never depend on those statistics: bit-identical either way.
  const bool exact = replicas() == 1;
  expect_same_tensors(straight_final_, final_checkpoint, exact ? 0 : 1e-5);
  expect_same_epochs(straight_.epochs, resumed.epochs, exact ? 0 : 1e-6);
  EXPECT_GE(resumed.epochs[0].seconds, saved.partial_seconds);
}

// A stop requested at the last step of an epoch is taken at the epoch's end: the boundary
// checkpoint is the one to resume from, and no mid-epoch file is written.
TEST_P(Resume, StopAtTheLastStepOfAnEpochStopsAtTheBoundary) {
  auto options = resume_options(replicas(), dir_.path());
  std::atomic<int> stop{0};
  options.stop_signal = &stop;
  const auto result =
      train(resume_data(), options, cpu_world(replicas()), nullptr, [&](const StepStats& s) {
        if (s.epoch == 1 && s.step == kStepsPerEpoch) stop = SIGTERM;
      });
  EXPECT_EQ(result.stopped_by, SIGTERM);
  EXPECT_EQ(result.epochs.size(), 1u);
  EXPECT_EQ(result.last_checkpoint, dir_.file(checkpoint_file_name(1, 0)));
  EXPECT_EQ(checkpoint_file_names(dir_.path()),
            std::vector<std::string>{checkpoint_file_name(1, 0)});
}

// The same with checkpoints every other epoch: a stop must still keep the finished epoch.
TEST_P(Resume, StopAtAnEpochBoundaryWritesACheckpointBetweenScheduledOnes) {
  auto options = resume_options(replicas(), dir_.path());
  options.epochs = 4;
  options.checkpoint_every = 2;
  std::atomic<int> stop{0};
  options.stop_signal = &stop;
  const auto result =
      train(resume_data(), options, cpu_world(replicas()), nullptr, [&](const StepStats& s) {
        if (s.epoch == 1 && s.step == kStepsPerEpoch) stop = SIGINT;
      });
  EXPECT_EQ(result.stopped_by, SIGINT);
  EXPECT_EQ(result.epochs.size(), 1u);
  EXPECT_EQ(result.last_checkpoint, dir_.file(checkpoint_file_name(1, 0)));
  EXPECT_EQ(checkpoint_file_names(dir_.path()),
            std::vector<std::string>{checkpoint_file_name(1, 0)});
}

// ---- Step checkpoints (--checkpoint-every-steps) ---------------------------------------------

// A file of one checkpoint directory copied into another, as a process killed after writing it
// would have left it (the checkpoints after it never written).
void copy_checkpoint(const std::string& from_dir, const std::string& name,
                     const std::string& to_dir) {
  const std::string text = read_text(from_dir + "/" + name);
  ASSERT_FALSE(text.empty()) << from_dir << "/" << name;
  write_bytes(to_dir + "/" + name, std::vector<uint8_t>(text.begin(), text.end()));
}

TEST_P(Resume, StepCheckpointsLeaveTheWeightsAsWithout) {
  ASSERT_NO_FATAL_FAILURE(run_straight());
  auto options = resume_options(replicas(), dir_.path());
  options.checkpoint_every_steps = 3;
  const auto stepped = train(resume_data(), options, cpu_world(replicas()));
  // Global steps 3, 6 | 9, 12, 15 inside the two epochs of 8 steps, and both epochs' ends.
  EXPECT_EQ(checkpoint_file_names(dir_.path()),
            (std::vector<std::string>{checkpoint_file_name(0, 3), checkpoint_file_name(0, 6),
                                      checkpoint_file_name(1, 0), checkpoint_file_name(1, 1),
                                      checkpoint_file_name(1, 4), checkpoint_file_name(1, 7),
                                      checkpoint_file_name(2, 0)}));
  const auto middle = read_checkpoint(dir_.file(checkpoint_file_name(1, 4)));
  EXPECT_EQ(middle.global_step, 12);
  EXPECT_EQ(middle.partial_sums.count, static_cast<double>(4 * kBatch));
  // The parameters never depend on the BatchNorm statistics that a step checkpoint averages:
  // bit-identical to the run without step checkpoints. The statistics are the same to rounding.
  const auto final_checkpoint = read_checkpoint(*stepped.last_checkpoint);
  expect_same_tensors(straight_final_, final_checkpoint, replicas() == 1 ? 0 : 1e-5);
}

// The optimizer's state of two checkpoints, by name, bit for bit.
void expect_same_state(const Checkpoint& a, const Checkpoint& b) {
  ASSERT_EQ(a.state.size(), b.state.size());
  for (size_t i = 0; i < a.state.size(); ++i) {
    EXPECT_EQ(a.state[i].first, b.state[i].first);
    EXPECT_TRUE(torch::equal(a.state[i].second, b.state[i].second)) << a.state[i].first;
  }
}

// Trains `options` (into a directory of its own) with a step checkpoint every 3 steps, then
// resumes as after a kill after global step 6 (inside epoch 1) or step 12 (inside epoch 2), from
// the checkpoints the killed run had left. Note [Step checkpoints resume bit for bit]: the
// weights, the optimizer's state, the statistics and the epochs' figures all end as those of the
// run that was not killed. Returns that run's last checkpoint.
Checkpoint expect_killed_runs_resume_bit_identical(TrainOptions options, int replicas) {
  TempDir written_dir;
  options.checkpoint_dir = written_dir.path();
  options.checkpoint_every_steps = 3;
  const auto straight = train(resume_data(), options, cpu_world(replicas));
  const auto straight_final = read_checkpoint(*straight.last_checkpoint);
  for (const int64_t killed_after : {6, 12}) {
    SCOPED_TRACE("killed after global step " + std::to_string(killed_after));
    TempDir dir;
    for (const auto& name : checkpoint_file_names(written_dir.path())) {
      if (read_checkpoint(written_dir.file(name)).global_step <= killed_after) {
        copy_checkpoint(written_dir.path(), name, dir.path());
      }
    }
    options.checkpoint_dir = dir.path();
    options.resume = true;
    const auto resumed = train(resume_data(), options, cpu_world(replicas));
    EXPECT_TRUE(resumed.resumed_from.has_value());
    if (!resumed.resumed_from) continue;
    EXPECT_EQ(read_checkpoint(*resumed.resumed_from).global_step, killed_after);
    const auto resumed_final = read_checkpoint(*resumed.last_checkpoint);
    expect_same_tensors(straight_final, resumed_final);
    expect_same_state(straight_final, resumed_final);
    expect_same_epochs(straight.epochs, resumed.epochs, 0);
    EXPECT_EQ(checkpoint_file_names(dir.path()), checkpoint_file_names(written_dir.path()));
  }
  return straight_final;
}

TEST_P(Resume, FromAStepCheckpointEndsBitIdenticalToTheRunThatWroteIt) {
  TempDir unused;
  expect_killed_runs_resume_bit_identical(resume_options(replicas(), unused.path()), replicas());
}

// Every part of the recipe that keeps state or depends on the position: momentum buffers,
// the schedule's step, the augmentation's draws, the averaged weights (whose BatchNorm
// statistics are averaged over the replicas with the model's), with clipping, weight decay and
// label smoothing beside them.
Recipe full_recipe() {
  Recipe r;
  r.sgd = SgdOptions{0.9, /*nesterov=*/true, 5e-4, /*weight_decay_skip_vectors=*/true};
  r.schedule = LrSchedule{LrShape::kCosine, /*warmup_epochs=*/0.5, 0, 0.1};
  r.label_smoothing = 0.1;
  r.augment = Augment::kCropFlip;
  r.clip_grad_norm = 1.0;
  r.ema_decay = 0.9;
  return r;
}

TEST_P(Resume, WithTheFullRecipeFromAStepCheckpointEndsBitIdentical) {
  TempDir unused;
  auto options = resume_options(replicas(), unused.path());
  options.recipe = full_recipe();
  const auto final_checkpoint = expect_killed_runs_resume_bit_identical(options, replicas());
  // The state is there: a momentum buffer per parameter, an average per parameter and buffer.
  size_t momentum = 0, averaged = 0;
  for (const auto& [name, tensor] : final_checkpoint.state) {
    momentum += name.rfind(kMomentumPrefix, 0) == 0;
    averaged += name.rfind(kAveragePrefix, 0) == 0;
  }
  EXPECT_EQ(averaged, final_checkpoint.tensors.size());
  EXPECT_GT(momentum, 0u);
  EXPECT_LT(momentum, averaged);  // parameters only
  EXPECT_EQ(recipe_flags(final_checkpoint.config.recipe), recipe_flags(full_recipe()));
  EXPECT_EQ(final_checkpoint.config.schedule_epochs, 2);
}

TEST_P(Resume, AnotherRecipeOrScheduleLengthIsAUsageError) {
  auto options = resume_options(replicas(), dir_.path());
  options.epochs = 1;
  options.recipe = full_recipe();
  train(resume_data(), options, cpu_world(replicas()));
  const std::string saved = dir_.file(checkpoint_file_name(1, 0));
  options.resume = true;
  {
    auto other = options;
    other.recipe.sgd.momentum = 0.8;
    expect_usage_error(
        [&] { train(resume_data(), other, cpu_world(replicas())); },
        {saved, "--momentum 0.9 --nesterov", "this run has --momentum 0.8", "give the same flags"});
  }
  {
    auto other = options;
    other.recipe = Recipe{};
    expect_usage_error([&] { train(resume_data(), other, cpu_world(replicas())); },
                       {saved, "--ema 0.9", "this run has the book's recipe"});
  }
  {
    auto other = options;
    other.epochs = 2;  // the cosine would be stretched over two epochs
    expect_usage_error([&] { train(resume_data(), other, cpu_world(replicas())); },
                       {saved, "--epochs 1", "this run has --epochs 2"});
  }
  EXPECT_EQ(checkpoint_file_names(dir_.path()),
            std::vector<std::string>{checkpoint_file_name(1, 0)});
}

// ---- Resuming on another world size ---------------------------------------------------------

// The largest difference of the parameters of two checkpoints, relative to the largest parameter.
double parameter_difference(const Checkpoint& a, const Checkpoint& b) {
  double difference = 0, scale = 0;
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    const auto& [name, x] = a.tensors[i];
    if (name.find("running_") != std::string::npos || !x.is_floating_point()) continue;
    const auto y = b.tensors[i].second.to(torch::kFloat64);
    difference = std::max(difference, (x.to(torch::kFloat64) - y).abs().max().item<double>());
    scale = std::max(scale, x.abs().max().item<double>());
  }
  return difference / scale;
}

// One step from a checkpoint written by `from` ranks, taken by `from` and by `to` ranks: how far
// apart their parameters end, relative to the largest parameter.
double one_step_on_another_world(int from, int to, bool sync_bn,
                                 std::vector<std::string>& notices) {
  TempDir dir;
  auto options = resume_options(from, dir.path());
  options.sync_bn = sync_bn;
  options.max_steps = 1;
  train(resume_data(), options, cpu_world(from));
  const std::string written = dir.file(checkpoint_file_name(0, 1));
  options.resume = true;
  options.max_steps = 2;
  Checkpoint after[2];
  for (const int world : {from, to}) {
    TempDir step_dir;
    copy_checkpoint(dir.path(), checkpoint_file_name(0, 1), step_dir.path());
    options.checkpoint_dir = step_dir.path();
    options.threads = world;
    TrainCallbacks callbacks;
    callbacks.on_notice = [&](const std::string& text) { notices.push_back(text); };
    const auto result = train(resume_data(), options, cpu_world(world), callbacks);
    after[world == from ? 0 : 1] = read_checkpoint(*result.last_checkpoint);
  }
  return parameter_difference(after[0], after[1]);
}

TEST(ResumeOnAnotherWorldSize, IsAllowedWithANoticeAndWithSyncBnTakesTheSameStepToRounding) {
  for (const auto& [from, to] : {std::pair{2, 1}, std::pair{4, 2}}) {
    SCOPED_TRACE(std::to_string(from) + " ranks to " + std::to_string(to));
    std::vector<std::string> notices;
    const double synced = one_step_on_another_world(from, to, /*sync_bn=*/true, notices);
    const double per_replica = one_step_on_another_world(from, to, /*sync_bn=*/false, notices);
    // Measured (width 4, 32 examples a batch, lr 0.05): 5.9e-8 (2 to 1) and 1.3e-7 (4 to 2) of
    // the largest parameter with --sync-bn, where only the order of the sums changes; 1.2e-2
    // and 1.4e-2 without, where each replica normalises its own, smaller share.
    EXPECT_LT(synced, 1e-6);
    EXPECT_GT(per_replica, 1000 * synced);
    EXPECT_GT(per_replica, 1e-5);
    const std::string expected =
        "was written by " + std::to_string(from) + " rank(s), this run has " + std::to_string(to);
    EXPECT_EQ(
        std::count_if(notices.begin(), notices.end(),
                      [&](const std::string& n) { return n.find(expected) != std::string::npos; }),
        2)
        << ::testing::PrintToString(notices);
  }
}

// ---- evaluate_weights -------------------------------------------------------------------------

TEST_P(Resume, EvaluateWeightsReproducesTheLastEpochsTestFigures) {
  auto options = resume_options(replicas(), dir_.path());
  options.epochs = 1;
  const auto result = train(resume_data(), options, cpu_world(replicas()));
  const auto checkpoint = read_checkpoint(*result.last_checkpoint);
  const auto eval =
      evaluate_weights(resume_data(), options, cpu_world(replicas()), checkpoint.tensors);
  EXPECT_EQ(eval.test_acc, result.epochs.back().test_acc);
  EXPECT_EQ(eval.test_loss, result.epochs.back().test_loss);
  EXPECT_EQ(eval.examples, kTestExamples);
  EXPECT_EQ(eval.devices, std::vector<std::string>(static_cast<size_t>(replicas()), "cpu"));
  // Not vacuous: the initial weights score differently.
  Checkpoint untrained = checkpoint;
  {
    auto fresh = options;
    fresh.epochs = 1;
    fresh.max_steps = 1;
    fresh.lr = 1e-9;
    fresh.checkpoint_dir = dir_.file("untrained");
    const auto barely = train(resume_data(), fresh, cpu_world(replicas()));
    untrained = read_checkpoint(*barely.last_checkpoint);
  }
  const auto before =
      evaluate_weights(resume_data(), options, cpu_world(replicas()), untrained.tensors);
  EXPECT_NE(before.test_loss, eval.test_loss);
}

// ---- Resumes that would not continue the same run ----------------------------------------------

TEST_P(Resume, AnotherModelOrDataOrderIsAUsageError) {
  auto options = resume_options(replicas(), dir_.path());
  options.epochs = 1;
  train(resume_data(), options, cpu_world(replicas()));
  const std::string saved = dir_.file(checkpoint_file_name(1, 0));
  options.epochs = 2;
  options.resume = true;
  {
    auto other = options;
    other.width = 8;
    expect_usage_error([&] { train(resume_data(), other, cpu_world(replicas())); },
                       {saved, "--width 4 (this run: 8)"});
  }
  {
    auto other = options;
    other.batch_size = 64;
    expect_usage_error([&] { train(resume_data(), other, cpu_world(replicas())); },
                       {saved, "--batch-size 32", "this run has 64"});
  }
  {
    auto other = options;
    other.seed = 4;
    expect_usage_error([&] { train(resume_data(), other, cpu_world(replicas())); },
                       {saved, "--seed 3", "this run has 4"});
  }
  {
    FashionMnist fewer = resume_data();
    fewer.train.images = fewer.train.images.narrow(0, 0, kTrainExamples - 1);
    fewer.train.labels = fewer.train.labels.narrow(0, 0, kTrainExamples - 1);
    expect_usage_error([&] { train(fewer, options, cpu_world(replicas())); },
                       {saved, std::to_string(kTrainExamples), std::to_string(kTrainExamples - 1)});
  }
  // Nothing was written by the refused runs.
  EXPECT_EQ(checkpoint_file_names(dir_.path()),
            std::vector<std::string>{checkpoint_file_name(1, 0)});
}

// A stray file of another width among the checkpoints is not read whole, however large its
// header says it is: a resume reads at its own width, so the stray is skipped, named, before
// its data is read, and the run resumes from its own checkpoint. The stray claims 4.4 GB of data
// (a sparse file): the bytes this process reads show that none of it was read.
TEST_P(Resume, AnOlderCheckpointOfAnotherWidthIsSkippedUnread) {
  auto options = resume_options(replicas(), dir_.path());
  options.epochs = 1;
  train(resume_data(), options, cpu_world(replicas()));
  const std::string saved = dir_.file(checkpoint_file_name(1, 0));
  Checkpoint stray = read_checkpoint(saved);
  stray.config.width = 8;
  const std::string stray_path = dir_.file(checkpoint_file_name(0, 3));  // named before `saved`
  const uint64_t data = uint64_t{4400} << 20;
  const auto header = header_claiming(stray, data);
  write_bytes(stray_path, header);
  ASSERT_EQ(::truncate(stray_path.c_str(), static_cast<off_t>(header.size() + data)), 0);
  options.epochs = 2;
  options.resume = true;
  std::vector<std::string> notices;
  TrainCallbacks callbacks;
  callbacks.on_notice = [&](const std::string& text) { notices.push_back(text); };
  const int64_t read_before = bytes_read_by("self");
  ASSERT_GE(read_before, 0) << "no /proc/self/io to count the bytes read";
  const auto resumed = train(resume_data(), options, cpu_world(replicas()), callbacks);
  // The resume read its own checkpoint (a few KB at width 4) and the stray's header, no more.
  EXPECT_LT(bytes_read_by("self") - read_before, int64_t{64} << 20);
  EXPECT_EQ(resumed.resumed_from, saved);
  EXPECT_EQ(resumed.epochs.size(), 2u);  // the checkpoint's epoch and this run's
  const std::string expected = "--resume: skipped checkpoint " + stray_path +
                               " was written for another model: --width 8 (this run: 4); not read";
  EXPECT_EQ(std::count(notices.begin(), notices.end(), expected), 1)
      << ::testing::PrintToString(notices);
}

TEST(ResumeOptions, ResumeWithoutADirectoryIsAUsageError) {
  auto options = resume_options(1, "");
  options.checkpoint_dir.reset();
  options.resume = true;
  expect_usage_error([&] { train(resume_data(), options, cpu_world(1)); },
                     {"--resume needs --checkpoint-dir"});
}

TEST(ResumeOptions, CheckpointEveryStepsWithoutADirectoryIsAUsageError) {
  auto options = resume_options(1, "");
  options.checkpoint_dir.reset();
  options.checkpoint_every_steps = 5;
  expect_usage_error([&] { train(resume_data(), options, cpu_world(1)); },
                     {"--checkpoint-every-steps needs --checkpoint-dir"});
}

TEST(ResumeOptions, ResumeFromAnEmptyDirectoryStartsAfresh) {
  TempDir dir, fresh_dir;
  auto options = resume_options(1, fresh_dir.path());
  options.epochs = 1;
  const auto fresh = train(resume_data(), options, cpu_world(1));
  options.checkpoint_dir = dir.path();
  options.resume = true;
  const auto resumed = train(resume_data(), options, cpu_world(1));
  EXPECT_FALSE(resumed.resumed_from.has_value());
  expect_same_epochs(fresh.epochs, resumed.epochs, 0);
  expect_same_tensors(read_checkpoint(*fresh.last_checkpoint),
                      read_checkpoint(*resumed.last_checkpoint));
}

// ---- Non-finite steps ---------------------------------------------------------------------------

// lr 1e30 sends the weights past float32's range within a few steps (step 2 here).
constexpr double kDivergingLr = 1e30;

std::string nonfinite_error(const std::function<void()>& body) {
  try {
    body();
  } catch (const UsageError& e) {
    ADD_FAILURE() << "a UsageError: " << e.what();
  } catch (const DataError& e) {
    ADD_FAILURE() << "a DataError: " << e.what();
  } catch (const std::exception& e) {
    return e.what();
  }
  ADD_FAILURE() << "training went on with a non-finite gradient";
  return "";
}

TEST_P(Resume, NonFiniteStopNamesTheStepAndWritesNoCheckpoint) {
  auto options = resume_options(replicas(), dir_.path());
  options.lr = kDivergingLr;
  options.on_nonfinite = NonFinite::kStop;
  int64_t last_step = 0;
  const auto message = nonfinite_error([&] {
    train(resume_data(), options, cpu_world(replicas()), nullptr,
          [&](const StepStats& s) { last_step = s.step; });
  });
  ASSERT_GT(last_step, 0);
  EXPECT_LE(last_step, 3) << message;
  // On the CPU the check is made after every step: the step named is the last one taken.
  EXPECT_NE(message.find("epoch 1 step " + std::to_string(last_step) + ":"), std::string::npos)
      << message;
  EXPECT_NE(message.find("not finite"), std::string::npos) << message;
  EXPECT_NE(message.find("--on-nonfinite skip"), std::string::npos) << message;
  EXPECT_TRUE(checkpoint_file_names(dir_.path()).empty());
}

TEST_P(Resume, NonFiniteStopAfterAGoodEpochKeepsItsCheckpoint) {
  auto options = resume_options(replicas(), dir_.path());
  options.epochs = 1;
  train(resume_data(), options, cpu_world(replicas()));
  const std::string good = dir_.file(checkpoint_file_name(1, 0));
  const auto good_before = read_checkpoint(good);

  // The same run resumed at a learning rate that diverges: stopped in epoch 2.
  options.epochs = 3;
  options.resume = true;
  options.lr = kDivergingLr;
  int64_t last_step = 0;
  const auto message = nonfinite_error([&] {
    train(resume_data(), options, cpu_world(replicas()), nullptr,
          [&](const StepStats& s) { last_step = s.step; });
  });
  EXPECT_NE(message.find("epoch 2 step " + std::to_string(last_step) + ":"), std::string::npos)
      << message;
  EXPECT_EQ(checkpoint_file_names(dir_.path()),
            std::vector<std::string>{checkpoint_file_name(1, 0)});
  expect_same_tensors(good_before, read_checkpoint(good));
}

TEST_P(Resume, NonFiniteSkipFinishesWithFiniteIdenticalReplicas) {
  auto options = resume_options(replicas(), dir_.path());
  options.epochs = 1;
  options.lr = kDivergingLr;
  options.on_nonfinite = NonFinite::kSkip;
  options.check_replicas_every = 1;  // throws on the first step where replicas differ
  const auto result = train(resume_data(), options, cpu_world(replicas()));
  EXPECT_GT(result.skipped_steps, 0);
  EXPECT_LT(result.skipped_steps, kStepsPerEpoch);  // the first step is finite
  ASSERT_EQ(result.epochs.size(), 1u);
  EXPECT_EQ(result.epochs[0].steps, kStepsPerEpoch);
  EXPECT_TRUE(std::isfinite(result.epochs[0].train_loss));
  const auto final_checkpoint = read_checkpoint(*result.last_checkpoint);
  for (const auto& [name, tensor] : final_checkpoint.tensors) {
    if (tensor.is_floating_point()) {
      EXPECT_TRUE(torch::isfinite(tensor).all().item<bool>()) << name;
    }
  }
  // After the first step the weights are ~1e30 times the gradient and every later gradient
  // overflows: all of them are skipped, leaving weights and BatchNorm statistics exactly as a
  // run of that one step leaves them.
  EXPECT_EQ(result.skipped_steps, kStepsPerEpoch - 1);
  TempDir one_step_dir;
  options.max_steps = 1;
  options.checkpoint_dir = one_step_dir.path();
  const auto one_step = train(resume_data(), options, cpu_world(replicas()));
  EXPECT_EQ(one_step.skipped_steps, 0);
  expect_same_tensors(read_checkpoint(*one_step.last_checkpoint), final_checkpoint);
}

// Note [An epoch without a trained step] and Note [A run that trained nothing] in rank.cpp.
// Epoch 1 at lr 1e30 trains its first step and skips the rest: its figures are those of that
// one step, as a run of that step alone reports them. Resumed for epochs 2 and 3, every step is
// skipped: those epochs have no training figures (NaN), their test figures all the same, their
// checkpoints are written and read back with the NaN history, and the run, which trained
// nothing, ends in an error without writing --save-model.
TEST_P(Resume, NonFiniteSkipAnEpochWithoutATrainedStepHasNoTrainingFigures) {
  auto options = resume_options(replicas(), dir_.path());
  options.epochs = 1;
  options.lr = kDivergingLr;
  options.on_nonfinite = NonFinite::kSkip;
  const auto first = train(resume_data(), options, cpu_world(replicas()));
  ASSERT_EQ(first.epochs.size(), 1u);
  EXPECT_EQ(first.epochs[0].skipped_steps, kStepsPerEpoch - 1);
  TempDir one_step_dir;
  auto one_step_options = options;
  one_step_options.max_steps = 1;
  one_step_options.checkpoint_dir = one_step_dir.path();
  const auto one_step = train(resume_data(), one_step_options, cpu_world(replicas()));
  ASSERT_EQ(one_step.epochs.size(), 1u);
  EXPECT_EQ(first.epochs[0].train_loss, one_step.epochs[0].train_loss);  // over trained steps
  EXPECT_EQ(first.epochs[0].train_acc, one_step.epochs[0].train_acc);
  EXPECT_GT(first.epochs[0].images_per_second, 0);

  options.epochs = 3;
  options.resume = true;
  TempDir model_dir;
  options.save_model = model_dir.file("m.safetensors");
  std::vector<EpochStats> reported;
  const auto message = nonfinite_error([&] {
    train(resume_data(), options, cpu_world(replicas()),
          [&](const EpochStats& s) { reported.push_back(s); });
  });
  EXPECT_NE(message.find("no step of this run trained: all " +
                         std::to_string(2 * kStepsPerEpoch) + " of its steps"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("--save-model " + *options.save_model + " was not written"),
            std::string::npos)
      << message;
  EXPECT_FALSE(path_exists(*options.save_model));
  ASSERT_EQ(reported.size(), 2u);
  for (const auto& s : reported) {
    EXPECT_TRUE(std::isnan(s.train_loss)) << s.epoch;
    EXPECT_TRUE(std::isnan(s.train_acc)) << s.epoch;
    EXPECT_TRUE(std::isnan(s.images_per_second)) << s.epoch;
    EXPECT_EQ(s.skipped_steps, kStepsPerEpoch) << s.epoch;
    EXPECT_EQ(s.steps, kStepsPerEpoch) << s.epoch;
    EXPECT_GE(s.test_acc, 0) << s.epoch;
    EXPECT_GT(s.seconds, 0) << s.epoch;
  }
  const auto last = read_checkpoint(dir_.file(checkpoint_file_name(3, 0)));
  ASSERT_EQ(last.history.size(), 3u);
  EXPECT_EQ(last.history[0].train_loss, first.epochs[0].train_loss);
  for (size_t i = 1; i < 3; ++i) {
    EXPECT_TRUE(std::isnan(last.history[i].train_loss)) << i;
    EXPECT_TRUE(std::isnan(last.history[i].train_acc)) << i;
    EXPECT_TRUE(std::isnan(last.history[i].images_per_second)) << i;
    EXPECT_EQ(last.history[i].test_acc, reported[i - 1].test_acc) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(, Resume, ::testing::Values(1, 2), replicas_name);

}  // namespace
