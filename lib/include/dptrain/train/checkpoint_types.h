// What a checkpoint holds, as plain data: the run's configuration, its position, the figures so
// far and the model's tensors, for the writer and every reader of the checkpoint family. Not
// here: the file format and the reader (checkpoint.h), what a run accepts to read
// (accepted_model.h).
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "dptrain/train/epoch_stats.h"
#include "dptrain/train/recipe.h"

namespace dptrain {

// Version 3 made checkpoints safetensors files; versions 1 and 2 (DPTRNCKP) are still read,
// never written (tests/fixtures/checkpoints holds files of theirs for the reader's tests).
constexpr uint32_t kCheckpointFormatVersion = 3;

// What a version 3 file says it is: a checkpoint of --checkpoint-dir or a --save-model file.
// Both hold the same; a model file is what a user takes elsewhere.
enum class CheckpointKind { kCheckpoint, kModel };

// What a checkpoint must agree with before its weights can be used (width, classes, input
// channels) and what it records of the run that wrote it (the rest).
struct CheckpointConfig {
  int64_t width = 0;
  int64_t num_classes = 0;
  int64_t in_channels = 0;
  int64_t batch_size = 0;
  double lr = 0;
  uint64_t seed = 0;
  int64_t train_size = 0;  // training examples per epoch
  int64_t world_size = 0;
  // SHA-256 of the training images and labels (data.h: dataset_digest), so that a resume on
  // another training set of the same size is refused. Empty in version 1 files.
  std::string train_digest;
  // The recipe the run trained with (the book's unless it says otherwise: files before recipes
  // have none), and its --epochs where the learning rate's schedule spans them (a schedule that
  // is not constant), else 0. A resume continues the same recipe (check_resumable).
  Recipe recipe;
  int64_t schedule_epochs = 0;
};

// The optimizer's state beside the weights, under the model tensor's name with a prefix:
// "momentum.<parameter>" (with momentum, after its first step) and "ema.<parameter or buffer>"
// (with --ema: the averaged weights).
constexpr char kMomentumPrefix[] = "momentum.";
constexpr char kAveragePrefix[] = "ema.";

struct Checkpoint {
  uint32_t format_version = kCheckpointFormatVersion;  // as read; serialize_checkpoint writes 3
  CheckpointKind kind = CheckpointKind::kCheckpoint;  // version 3; older files are checkpoints
  CheckpointConfig config;
  int64_t epochs_done = 0;    // complete epochs
  int64_t step_in_epoch = 0;  // steps already taken in epoch epochs_done + 1 (0: at a boundary)
  int64_t global_step = 0;
  // The unfinished epoch's sums over all ranks (loss sum, correct, count) and training seconds,
  // so that a resumed epoch reports the same figures as an uninterrupted one.
  Totals partial_sums;
  double partial_seconds = 0;
  std::vector<EpochStats> history;  // the finished epochs' figures
  // Parameters and buffers by their model names, on the CPU, contiguous.
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  // The optimizer's state (kMomentumPrefix, kAveragePrefix), on the CPU, contiguous; in the
  // file beside `tensors`.
  std::vector<std::pair<std::string, torch::Tensor>> state;
};

}  // namespace dptrain
