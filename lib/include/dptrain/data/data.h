// Fashion-MNIST in memory: where the files are, loading and validating them, and turning uint8
// images into the float batches the model reads. Not here: which examples form a batch
// (batching.h).
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <optional>
#include <string>

namespace dptrain {

constexpr int64_t kNumClasses = 10;
constexpr int64_t kImageSide = 28;

// One split of the data set, held as bytes: 60,000 training images are 47 MB.
struct Dataset {
  torch::Tensor images;  // (N, 28, 28) uint8
  torch::Tensor labels;  // (N) int64, each in 0..9
  int64_t size() const { return labels.defined() ? labels.size(0) : 0; }
};

struct FashionMnist {
  Dataset train;
  Dataset test;
  Dataset validation;  // held out of the training images (split_validation); empty when none
};

// The file names of the four IDX files, as published (each may also lack the ".gz").
extern const char* const kTrainImagesFile;  // "train-images-idx3-ubyte.gz"
extern const char* const kTrainLabelsFile;  // "train-labels-idx1-ubyte.gz"
extern const char* const kTestImagesFile;   // "t10k-images-idx3-ubyte.gz"
extern const char* const kTestLabelsFile;   // "t10k-labels-idx1-ubyte.gz"

// Where Debian's dataset-fashion-mnist installs the files: "/usr/share/datasets/fashion-mnist".
extern const char* const kSystemDataDir;

// Where the data lives: `flag_value` when given, else $DPTRAIN_DATA, else `system_dir` (the
// binary's is kSystemDataDir; tests give their own), else ./data/fashion-mnist, taking the first
// that holds the files. Throws DataError, saying how to get the files, when none does.
std::string resolve_data_dir(const std::optional<std::string>& flag_value,
                             const std::string& system_dir = kSystemDataDir);

// Loads one split from its two files, checking that images are (N, 28, 28), labels (N), the
// counts agree and every label is in 0..9. `limit` > 0 keeps only the first `limit` examples.
Dataset load_split(const std::string& images_path, const std::string& labels_path,
                   int64_t limit = 0);

// Loads both splits from `dir` (each file plain or gzip-compressed), and holds `val_split` of the
// training images left after `train_limit` out as the validation set (split_validation).
FashionMnist load_fashion_mnist(const std::string& dir, int64_t train_limit = 0,
                                int64_t test_limit = 0, int64_t val_split = 0);

// The seed that chooses the validation images: fixed, not the run's --seed, so that every run
// holds out the same images of the same training set, whatever its seed or world size.
constexpr uint64_t kValidationSplitSeed = 0x76616c6964617465;  // "validate" in ASCII

// A training set with `count` of its images held out for validation.
struct TrainValidation {
  Dataset train;       // the images not held out, in their original order
  Dataset validation;  // the `count` held out, in their original order; empty when count is 0
};

// Holds out `count` images of `train`: those whose indices come first in a random permutation of
// 0..N-1 (core/random.h's random_permutation, SplitMix64 seeded with kValidationSplitSeed).
// Throws UsageError naming --val-split unless 0 <= count < N: at least one image must train.
TrainValidation split_validation(const Dataset& train, int64_t count);

// SHA-256 (hex) of a split's images and labels, with their sizes: equal for equal data and
// nothing else, whatever the files' names or compression. Checkpoints record the training set's,
// and the ranks of a world compare theirs.
std::string dataset_digest(const Dataset& set);

// images: (N, 28, 28) uint8 on any device -> (N, 1, 28, 28) float32 in [0, 1] on the same device.
torch::Tensor to_model_input(const torch::Tensor& images);

}  // namespace dptrain
