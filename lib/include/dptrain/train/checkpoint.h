// Checkpoints: the whole state of a run at a step boundary (weights, position, the figures so
// far, the configuration) in dptrain's own small file format, written atomically, and a reader
// that refuses anything else with one clear line. Not here: when to save (RankTraining::run in
// lib/src/train/rank.cpp).
//
// File layout, little-endian:
//   8 bytes  magic "DPTRNCKP"
//   u32      format version (kCheckpointFormatVersion)
//   u64      payload size in bytes
//   u32      CRC-32 (zlib's) of the magic, version and size, then the payload (version 1: of the
//            payload alone)
//   payload: the configuration (with the training set's digest from version 2 on), the
//            position, the epoch history, then the named tensors
//            (name, dtype code, rank, dims, raw bytes in row-major order).
#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dptrain/train/epoch_stats.h"

namespace dptrain {

// Version 2 added the training set's digest and a CRC-32 that covers the header; version 1
// files are still read (and written back as version 1: see Checkpoint::format_version).
constexpr uint32_t kCheckpointFormatVersion = 2;

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
};

struct TrainOptions;

// What a checkpoint of this run records of it: the model and data-order settings of `options`,
// the training set's size and digest (dataset_digest) and the world size.
CheckpointConfig checkpoint_config(const TrainOptions& options, int64_t train_size, int world_size,
                                   const std::string& train_digest);

struct Checkpoint {
  uint32_t format_version = kCheckpointFormatVersion;  // as read; what serialize_checkpoint writes
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
};

std::vector<uint8_t> serialize_checkpoint(const Checkpoint& checkpoint);
// Throws DataError "checkpoint NAME: ..." saying what is wrong: foreign (a zip archive
// included), truncated, corrupt, a newer format, or contents no run can have (a position
// outside its epoch, a history of another length, a non-finite figure: Note [A checkpoint's
// contents are checked, not only its CRC] in checkpoint.cpp).
Checkpoint parse_checkpoint(const std::vector<uint8_t>& bytes, const std::string& name);

// The most bytes a checkpoint of this model and history can take, names at their longest:
// a file larger than this is refused before it is read.
uint64_t checkpoint_size_limit(int64_t width, int64_t num_classes, int64_t in_channels,
                               int64_t epochs_done);

// Writes `path` through a temporary file in the same directory, fsync and rename, so that a
// crash or a full disk never leaves a half-written file under `path` or harms an older
// checkpoint. Throws DataError with the path and the cause.
void write_checkpoint_atomically(const Checkpoint& checkpoint, const std::string& path);
// Reads the header and the configuration first and refuses a file larger than the model it
// claims can fill (checkpoint_size_limit), unread; then the whole file, once. Messages start
// "<what> PATH" ("checkpoint PATH", "--model PATH").
Checkpoint read_checkpoint(const std::string& path, const std::string& what = "checkpoint");

// Throws UsageError listing every model setting in which `saved` differs from `run`
// ("checkpoint F was written for --width 8, this run has --width 16").
void check_checkpoint_matches(const CheckpointConfig& saved, const CheckpointConfig& run,
                              const std::string& name);

// The model's parameters and buffers as checkpoint tensors (CPU copies), and back. Loading
// checks that every name is present with its shape; throws DataError otherwise.
std::vector<std::pair<std::string, torch::Tensor>> model_tensors(const torch::nn::Module& model);
void load_model_tensors(torch::nn::Module& model,
                        const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                        const std::string& name);

}  // namespace dptrain
