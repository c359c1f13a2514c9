// Tests of the printed lines (report.h): exact text of the epoch, final, progress and eval
// lines, and no control characters in anything meant for logs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "dptrain/report/report.h"

namespace dptrain {
namespace {

ProgressStats progress_at(int64_t step) {
  ProgressStats p;
  p.epoch = 2;
  p.epochs = 10;
  p.step = step;
  p.steps_in_epoch = 200;
  p.images = step * 256;
  p.seconds = static_cast<double>(step) * 0.1;  // 2560 img/s
  p.running_loss = 0.41234;
  p.running_acc = 0.85119;
  return p;
}

TEST(Report, ProgressLineIsExact) {
  EXPECT_EQ(format_progress_line(progress_at(50)),
            "epoch 2/10 step 50/200: loss 0.4123, acc 0.8512, 2560 img/s, 15 s left");
}

TEST(Report, ProgressBarIsExactAndFillsInProportion) {
  EXPECT_EQ(format_progress_bar(progress_at(50), 8),
            "epoch 2/10 [##......] 50/200  2560 img/s  loss 0.4123  acc 0.8512  ETA 0:15");
  EXPECT_EQ(format_progress_bar(progress_at(200), 8).substr(0, 21), "epoch 2/10 [########]");
  auto start = progress_at(0);
  start.seconds = 0;
  EXPECT_EQ(format_progress_bar(start, 4),
            "epoch 2/10 [....] 0/200  0 img/s  loss 0.4123  acc 0.8512  ETA 0:00");
}

TEST(Report, NoControlCharactersInLines) {
  for (const auto& text :
       {format_progress_line(progress_at(7)), format_progress_bar(progress_at(7), 30)}) {
    for (const char c : text) EXPECT_GE(static_cast<unsigned char>(c), 0x20u) << text;
  }
}

EpochStats epoch_three() {
  EpochStats stats;
  stats.epoch = 3;
  stats.epochs = 10;
  stats.train_loss = 0.30123;
  stats.train_acc = 0.88912;
  stats.test_acc = 0.87654;
  stats.seconds = 13.21;
  stats.images_per_second = 4545.4;
  return stats;
}

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// The efficiency figures follow the book's where they are known: none for an epoch from a
// checkpoint's history; TFLOP/s and the process's peak on the CPU, with the MFU only where a peak
// was given; the GPU's own peak on CUDA.
TEST(Report, EpochLineIsExactWithEachEfficiencyFigureWhereKnown) {
  const std::string book =
      "epoch 3/10: train loss 0.3012, train acc 0.8891, test acc 0.8765, 13.2 s, 4545 img/s";
  auto stats = epoch_three();
  EXPECT_EQ(format_epoch_line(stats), book);
  stats.tflops = 0.03821;
  stats.peak_host_bytes = 1.3 * kGiB;
  EXPECT_EQ(format_epoch_line(stats), book + ", 0.0382 TFLOP/s, peak RSS 1.3 GiB");
  stats.mfu = 0.0041;
  stats.peak_host_bytes = 412.0 * 1024 * 1024;
  EXPECT_EQ(format_epoch_line(stats), book + ", 0.0382 TFLOP/s (MFU 0.41%), peak RSS 412 MiB");
  stats.tflops = 312.4;
  stats.mfu = 0.3158;
  stats.peak_device_bytes = 12.1 * kGiB;
  EXPECT_EQ(format_epoch_line(stats), book + ", 312 TFLOP/s (MFU 32%), GPU peak 12.1 GiB");
}

// With a validation set (--val-split) its accuracy follows the test accuracy; without one the
// line is the book's, whatever the evaluations' seconds.
TEST(Report, EpochLineShowsTheValidationAccuracyWhereThereIsOne) {
  auto stats = epoch_three();
  stats.eval_seconds = 1.25;
  EXPECT_EQ(format_epoch_line(stats),
            "epoch 3/10: train loss 0.3012, train acc 0.8891, test acc 0.8765, 13.2 s, 4545 img/s");
  stats.val_loss = 0.3125;
  stats.val_acc = 0.91234;
  EXPECT_EQ(format_epoch_line(stats),
            "epoch 3/10: train loss 0.3012, train acc 0.8891, test acc 0.8765, val acc 0.9123, "
            "13.2 s, 4545 img/s");
}

// Note [An epoch without a trained step] in train/rank.cpp: skipped steps are counted after the
// training figures they leave out, and an epoch with none trained has no figures but "-" (never
// 0.0000, which reads as a perfect fit); its test figures and efficiency stay.
TEST(Report, EpochLineSaysWhichStepsWereSkippedAndHasNoFigureWhereNoneTrained) {
  auto stats = epoch_three();
  stats.steps = 8;
  stats.skipped_steps = 3;
  EXPECT_EQ(format_epoch_line(stats),
            "epoch 3/10: train loss 0.3012, train acc 0.8891 (3 of 8 steps skipped, non-finite), "
            "test acc 0.8765, 13.2 s, 4545 img/s");
  stats.skipped_steps = 8;
  stats.train_loss = std::nan("");
  stats.train_acc = std::nan("");
  stats.images_per_second = std::nan("");
  stats.tflops = 0.0274;
  stats.peak_host_bytes = 310.0 * 1024 * 1024;
  EXPECT_EQ(format_epoch_line(stats),
            "epoch 3/10: train loss -, train acc - (no step trained: all 8 steps skipped, "
            "non-finite), test acc 0.8765, 13.2 s, - img/s, 0.0274 TFLOP/s, peak RSS 310 MiB");
}

TEST(Report, EvalLineIsExact) {
  EvalResult result;
  result.test_acc = 0.90125;
  result.test_loss = 0.27344;
  result.examples = 10000;
  result.devices = {"cpu", "cpu"};
  EXPECT_EQ(format_eval_line(result),
            "test acc: 0.9012, test loss 0.2734 (10000 images) on [cpu, cpu]");
  // Weights whose logits overflow give a NaN loss, negative-signed as often as not: one spelling.
  result.test_loss = -std::numeric_limits<double>::quiet_NaN();
  EXPECT_EQ(format_eval_line(result),
            "test acc: 0.9012, test loss nan (10000 images) on [cpu, cpu]");
}

// The first epoch pays for cuDNN's autotuning and the allocator's growth: the steady pace is
// the median of the others.
TEST(Report, SteadySecondsIsTheMedianFromTheSecondEpoch) {
  EXPECT_FALSE(steady_epoch_seconds({}).has_value());
  EXPECT_FALSE(steady_epoch_seconds({9.0}).has_value());
  EXPECT_EQ(steady_epoch_seconds({9.0, 2.0}), 2.0);
  EXPECT_EQ(steady_epoch_seconds({9.0, 3.0, 1.0, 2.0}), 2.0);       // odd count: the middle
  EXPECT_EQ(steady_epoch_seconds({9.0, 4.0, 1.0, 2.0, 3.0}), 2.5);  // even: the mean of two
}

TEST(Report, SteadyLineIsExactAndAbsentForOneEpoch) {
  TrainResult result;
  result.devices = {"cuda:0"};
  EpochStats first;
  first.epoch = 1;
  first.seconds = 3.14;
  result.epochs = {first};
  EXPECT_EQ(format_steady_line(result), "");
  for (double seconds : {0.95, 0.93, 0.97}) {
    EpochStats later = first;
    later.epoch = static_cast<int64_t>(result.epochs.size()) + 1;
    later.seconds = seconds;
    result.epochs.push_back(later);
  }
  EXPECT_EQ(format_steady_line(result),
            "median of epochs 2-4: 0.95 sec/epoch (epoch 1: 3.14 s); the book's line below is "
            "the mean of epochs 1-4");
}

// Three epochs of 100 steps: the wall pace of epochs 2-3 is 2.0 and 2.4 ms a step (median 2.2);
// the GPU's timed steps beside it decide the verdict.
TEST(Report, StepTimeLineSetsGpuBesideWallAndNamesTheBound) {
  TrainResult result;
  for (double seconds : {5.0, 0.2, 0.24}) {
    EpochStats epoch;
    epoch.epoch = static_cast<int64_t>(result.epochs.size()) + 1;
    epoch.seconds = seconds;
    epoch.steps = 100;
    result.epochs.push_back(epoch);
  }
  EXPECT_EQ(format_step_time_line(result), "");  // nothing timed: the CPU
  result.gpu_step_ms = {1.0, 1.2, 0.9, 1.1};     // median 1.05
  EXPECT_EQ(format_step_time_line(result),
            "GPU time per step: median 1.05 ms of 4 timed steps (CUDA events); wall time per "
            "step: median 2.2 ms (epochs 2-3): host-bound, the wall is 2.10x the GPU time");
  result.gpu_step_ms = {1.5};
  EXPECT_EQ(format_step_time_line(result),
            "GPU time per step: median 1.5 ms of 1 timed step (CUDA events); wall time per "
            "step: median 2.2 ms (epochs 2-3): partly host-bound, the wall is 1.47x the GPU time");
  result.gpu_step_ms = {2.1};
  EXPECT_EQ(format_step_time_line(result),
            "GPU time per step: median 2.1 ms of 1 timed step (CUDA events); wall time per "
            "step: median 2.2 ms (epochs 2-3): GPU-bound (the GPU works 95% of the wall time)");
  result.epochs.resize(1);  // one epoch: its own pace, warm-up and all
  EXPECT_EQ(format_step_time_line(result),
            "GPU time per step: median 2.1 ms of 1 timed step (CUDA events); wall time per "
            "step: median 50 ms (epoch 1): host-bound, the wall is 23.81x the GPU time");
}

// The book's final line, and after it on a timed GPU run what the step timer dropped.
TEST(Report, FinalLineIsTheBooksAndSaysWhatTheTimerDropped) {
  TrainResult result;
  result.devices = {"cuda:0"};
  for (double seconds : {1.5, 0.5}) {
    EpochStats epoch;
    epoch.epoch = static_cast<int64_t>(result.epochs.size()) + 1;
    epoch.seconds = seconds;
    epoch.test_acc = 0.9312;
    result.epochs.push_back(epoch);
  }
  EXPECT_EQ(format_final_line(result), "test acc: 0.93, 1.0 sec/epoch on [cuda:0]");
  result.gpu_samples = 6;
  result.gpu_samples_dropped = 6;
  EXPECT_EQ(format_final_line(result),
            "test acc: 0.93, 1.0 sec/epoch on [cuda:0]; GPU timer: 6 of 6 samples dropped");
  result.gpu_samples_dropped = 0;
  EXPECT_EQ(format_final_line(result),
            "test acc: 0.93, 1.0 sec/epoch on [cuda:0]; GPU timer: 0 of 6 samples dropped");
}

// A --cuda-graph run says once how many nodes its captured step holds.
TEST(Report, GraphLineGivesTheCapturedNodesOnceKnown) {
  TrainResult result;
  EXPECT_EQ(format_graph_line(result), "");  // no graph, or a LibTorch that cannot count
  result.graph_nodes = 712;
  result.graph_replays = 2340;
  EXPECT_EQ(format_graph_line(result),
            "CUDA graph: one step is 712 nodes (kernels, copies, memsets: the launches one "
            "replay stands for), replayed 2340 times");
}

}  // namespace
}  // namespace dptrain
