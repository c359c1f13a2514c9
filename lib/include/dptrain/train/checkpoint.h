// Checkpoints and model files: the whole state of a run at a step boundary (weights, position,
// the figures so far, the configuration) as a safetensors file (core/safetensors.h) whose
// metadata holds the run state as JSON and a digest of the content, written atomically, and a
// strict reader that refuses anything else with one clear line. Files of dptrain's own format of
// versions 1 and 2 (DPTRNCKP) are still read. Not here: what a checkpoint holds, as plain data
// (checkpoint_types.h), what a run accepts to read (accepted_model.h), when to save
// (RankTraining::run in lib/src/train/rank.cpp), the directory of checkpoints
// (checkpoint_directory.h).
//
// Version 3: a safetensors file of the model's parameters and buffers under the names of the
// book's PyTorch model, whose "__metadata__" holds "dptrain.format_version" ("3"),
// "dptrain.kind" ("checkpoint" or "model"), "dptrain.run_state" (the configuration, position,
// partial sums and history as JSON), "dptrain.digest" (Note [A digest of the content, not of the
// bytes] in checkpoint.cpp) and facts for people (width, epochs, test accuracy, versions). The
// full list: docs/checkpoints.md.
#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "dptrain/core/files.h"
#include "dptrain/core/safetensors.h"
#include "dptrain/train/accepted_model.h"
#include "dptrain/train/checkpoint_types.h"

namespace dptrain {

struct TrainOptions;

// What a checkpoint of this run records of it: the model and data-order settings of `options`,
// the training set's size and digest (dataset_digest) and the world size.
CheckpointConfig checkpoint_config(const TrainOptions& options, int64_t train_size, int world_size,
                                   const std::string& train_digest);

// A version 3 file of `checkpoint`, whose format_version must be 3 (older versions are read only).
std::vector<uint8_t> serialize_checkpoint(const Checkpoint& checkpoint);
// Throws DataError "checkpoint NAME: ..." saying what is wrong: foreign (a zip archive or a
// safetensors file without a run state included), truncated, corrupt (a header that is no
// safetensors header, a digest that does not match), a newer format, or contents no run can have
// (a position outside its epoch, a history of another length, a non-finite figure: Note [A
// checkpoint's contents are checked, not only its digest] in checkpoint.cpp).
Checkpoint parse_checkpoint(const std::vector<uint8_t>& bytes, const std::string& name);

// The most bytes a file holding a model of this shape can take (its header at the longest a
// reader accepts, every element at 8 bytes): a larger file is refused before its data is read.
uint64_t checkpoint_size_limit(int64_t width, int64_t num_classes, int64_t in_channels);

// Writes `path` through a temporary file in the same directory, fsync and rename, so that a
// crash or a full disk never leaves a half-written file under `path` or harms an older
// checkpoint. Throws DataError with the path and the cause.
void write_checkpoint_atomically(const Checkpoint& checkpoint, const std::string& path);
// Reads the header first (its length capped: kMaxSafetensorsHeaderBytes), checks what it claims
// against `accepted` (Note [A file is bounded by what the run can use, not by its own word] in
// accepted_model.h) and refuses a file larger than that model can fill (checkpoint_size_limit),
// unread; then the data, once. Messages start "<what> PATH" ("checkpoint PATH", "--model PATH"); memory that runs out
// while the file is read is a DataError naming the file. Any version. Without `accepted`:
// accepted_in_memory(false).
Checkpoint read_checkpoint(const std::string& path, const std::string& what,
                           const AcceptedModel& accepted);
Checkpoint read_checkpoint(const std::string& path, const std::string& what = "checkpoint");

// The weights `eval --model` reads: a model file or checkpoint of dptrain's (any version, its
// width from its run state), or any safetensors file of the model's tensors under their names
// (a state_dict saved in PyTorch with safetensors.torch.save_file), its width read from the stem
// convolution's shape. With `accepted.model_tensors`, the header's names, shapes and dtypes are
// checked against that model before the data is read: exactly in dptrain's own files; in a
// plain file as PyTorch's load_state_dict reads it (floating-point weights of another floating
// dtype converted, BatchNorm's num_batches_tracked optional: Note [A state dict from PyTorch is
// read as PyTorch reads it] in checkpoint.cpp), the tensors then returned as the model holds
// them. load_model_tensors checks them again when they are loaded.
struct ModelWeights {
  NamedTensors tensors;
  int64_t width = 0;
  // What was done to a plain file's tensors to make them the model's (dtypes converted, buffers
  // filled), for one notice line; empty when nothing was.
  std::string notice;
};
ModelWeights read_model_weights(const std::string& path, const std::string& what,
                                const AcceptedModel& accepted);

// The "dptrain.digest" a version 3 file of this header and data must carry ("sha256:" and 64
// hex digits; Note [A digest of the content, not of the bytes] in checkpoint.cpp).
std::string checkpoint_content_digest(const SafetensorsHeader& header, const uint8_t* data);

// Whether `file` says it is a checkpoint of dptrain's: a safetensors header whose metadata has
// "dptrain.kind": "checkpoint", or DPTRNCKP's magic; the rest is not read or checked (--fresh
// removes damaged checkpoints too, never another program's file).
bool is_checkpoint_file(const RegularFile& file);

// Throws UsageError listing every model setting in which `saved` differs from `run`
// ("checkpoint F was written for --width 8, this run has --width 16").
void check_checkpoint_matches(const CheckpointConfig& saved, const CheckpointConfig& run,
                              const std::string& name);

// The weights a checkpoint's run evaluated after each epoch: with --ema the averaged ones (its
// "ema." state, under the model's names; a --save-model file holds them as its model), else its
// weights. A DataError when the recipe says --ema and a checkpoint lacks the average.
std::vector<std::pair<std::string, torch::Tensor>> evaluated_weights(const Checkpoint& checkpoint,
                                                                     const std::string& name);

// The model's parameters and buffers as checkpoint tensors (CPU copies), and back. Loading
// checks that every name is present with its shape; throws DataError otherwise.
std::vector<std::pair<std::string, torch::Tensor>> model_tensors(const torch::nn::Module& model);
void load_model_tensors(torch::nn::Module& model,
                        const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                        const std::string& name);

}  // namespace dptrain
