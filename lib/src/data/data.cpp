// Fashion-MNIST: locating, loading and validating the four IDX files. See data.h.
#include "dptrain/data/data.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dptrain/core/errors.h"
#include "dptrain/core/files.h"
#include "dptrain/core/random.h"
#include "dptrain/core/sha256.h"
#include "dptrain/data/idx.h"

namespace dptrain {

const char* const kTrainImagesFile = "train-images-idx3-ubyte.gz";
const char* const kTrainLabelsFile = "train-labels-idx1-ubyte.gz";
const char* const kTestImagesFile = "t10k-images-idx3-ubyte.gz";
const char* const kTestLabelsFile = "t10k-labels-idx1-ubyte.gz";
const char* const kSystemDataDir = "/usr/share/datasets/fashion-mnist";

namespace {

constexpr const char* kLocalDataDir = "data/fashion-mnist";

// Why `path` cannot be looked at, for a stat that failed with `error`. Permission is denied by
// a directory on the way that this user may not enter: it is named, not the file.
std::string cannot_look_at(const std::string& path, int error) {
  if (error == EACCES) {
    for (size_t slash = path.find('/', 1); slash != std::string::npos;
         slash = path.find('/', slash + 1)) {
      const std::string directory = path.substr(0, slash);
      if (::access(directory.c_str(), X_OK) != 0 && errno == EACCES) {
        return "cannot enter directory " + directory + ": " + std::strerror(EACCES);
      }
    }
  }
  return path + ": " + std::strerror(error);
}

// The published name, or the same without ".gz" (a user may have unpacked the files). A file
// that is not there is nullopt. A name that is there but is not a regular file (a FIFO, a
// device, a directory), or cannot be looked at (permission denied on the way), is a DataError
// saying so: it is not missing, and installing the data would not help. stat, not lstat: a
// symbolic link to a regular file is fine, one to /dev/zero is a device (Note [No
// std::filesystem] in files.cpp).
std::optional<std::string> find_file(const std::string& dir, const std::string& gz_name) {
  const std::string gz = dir + "/" + gz_name;
  for (const std::string& path : {gz, gz.substr(0, gz.size() - 3)}) {
    struct stat info {};
    if (::stat(path.c_str(), &info) == 0) {
      if (S_ISREG(info.st_mode)) return path;
      throw DataError(path + ": is " + file_kind(info.st_mode) + ", not a regular file");
    } else if (errno != ENOENT) {
      throw DataError(cannot_look_at(path, errno));
    }
  }
  return std::nullopt;
}

// Whether `dir` holds all four files: false when it or a file is missing. A directory that is
// not one, or that this user may not enter, or a file that is not a regular one, is a DataError
// that starts with `source`.
bool holds_all_files(const std::string& dir, const std::string& source) {
  struct stat info {};
  if (::stat(dir.c_str(), &info) != 0) {
    const int error = errno;
    if (error == ENOENT || error == ENOTDIR) return false;  // not there
    if (error != EACCES) throw DataError(source + ": " + std::strerror(error));
    throw DataError(source + ": " + cannot_look_at(dir, error));
  }
  if (!S_ISDIR(info.st_mode)) throw DataError(source + ": not a directory");
  try {
    for (const char* name :
         {kTrainImagesFile, kTrainLabelsFile, kTestImagesFile, kTestLabelsFile}) {
      if (!find_file(dir, name)) return false;
    }
  } catch (const DataError& e) {
    throw DataError(source + ": " + e.what());
  }
  return true;
}

std::string required_file(const std::string& dir, const char* gz_name) {
  auto path = find_file(dir, gz_name);
  if (!path) {
    throw DataError(dir + ": " + gz_name + " (or its unpacked form) is missing");
  }
  return *path;
}

std::string shape_string(const std::vector<int64_t>& dims) {
  std::string out = "(";
  for (size_t i = 0; i < dims.size(); ++i) out += (i ? ", " : "") + std::to_string(dims[i]);
  return out + ")";
}

}  // namespace

std::string resolve_data_dir(const std::optional<std::string>& flag_value,
                             const std::string& system_dir) {
  const char* kHowToGet =
      "install Debian's dataset-fashion-mnist (apt-get install dataset-fashion-mnist), or put "
      "the four Fashion-MNIST IDX files (train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, "
      "t10k-images-idx3-ubyte.gz, t10k-labels-idx1-ubyte.gz) in a directory and pass "
      "--data-dir or set DPTRAIN_DATA";
  if (flag_value) {
    if (!holds_all_files(*flag_value, "--data-dir " + *flag_value)) {
      throw DataError("--data-dir " + *flag_value +
                      ": does not hold the four Fashion-MNIST files; " + kHowToGet);
    }
    return *flag_value;
  }
  if (const char* env = std::getenv("DPTRAIN_DATA"); env && *env) {
    if (!holds_all_files(env, std::string("DPTRAIN_DATA=") + env)) {
      throw DataError(std::string("DPTRAIN_DATA=") + env +
                      ": does not hold the four Fashion-MNIST files; " + kHowToGet);
    }
    return env;
  }
  for (const std::string& dir : {system_dir, std::string(kLocalDataDir)}) {
    if (holds_all_files(dir, dir)) return dir;
  }
  throw DataError("no Fashion-MNIST data found in " + system_dir + " or ./" + kLocalDataDir + "; " +
                  kHowToGet);
}

Dataset load_split(const std::string& images_path, const std::string& labels_path, int64_t limit) {
  IdxArray images = read_idx_file(images_path);
  IdxArray labels = read_idx_file(labels_path);
  if (images.dims.size() != 3 || images.dims[1] != kImageSide || images.dims[2] != kImageSide) {
    throw DataError(images_path + ": images have shape " + shape_string(images.dims) +
                    ", expected (N, 28, 28)");
  }
  if (labels.dims.size() != 1) {
    throw DataError(labels_path + ": labels have shape " + shape_string(labels.dims) +
                    ", expected (N)");
  }
  if (images.dims[0] != labels.dims[0]) {
    throw DataError(images_path + " holds " + std::to_string(images.dims[0]) + " images but " +
                    labels_path + " holds " + std::to_string(labels.dims[0]) + " labels");
  }
  for (size_t i = 0; i < labels.data.size(); ++i) {
    if (labels.data[i] >= kNumClasses) {
      throw DataError(labels_path + ": label " + std::to_string(labels.data[i]) + " at index " +
                      std::to_string(i) + " is outside 0..9");
    }
  }
  // An empty set would reach the training as a batch of 0, or report the accuracy of nothing.
  if (images.dims[0] == 0) {
    throw DataError(images_path +
                    ": holds 0 images (its header's count); dptrain needs at "
                    "least one");
  }
  int64_t n = images.dims[0];
  if (limit > 0 && limit < n) n = limit;
  Dataset split;
  try {
    split.images = torch::from_blob(images.data.data(), {images.dims[0], kImageSide, kImageSide},
                                    torch::kUInt8)
                       .narrow(0, 0, n)
                       .clone();
    split.labels = torch::from_blob(labels.data.data(), {labels.dims[0]}, torch::kUInt8)
                       .narrow(0, 0, n)
                       .to(torch::kInt64);
  } catch (const std::bad_alloc&) {
    throw DataError(images_path + ": out of memory while loading the data set (" +
                    std::to_string(n) + " images); free memory, or raise the process's limit " +
                    "(ulimit -v), or pass a smaller --train-limit / --test-limit");
  }
  return split;
}

FashionMnist load_fashion_mnist(const std::string& dir, int64_t train_limit, int64_t test_limit,
                                int64_t val_split) {
  FashionMnist data;
  data.train = load_split(required_file(dir, kTrainImagesFile),
                          required_file(dir, kTrainLabelsFile), train_limit);
  data.test = load_split(required_file(dir, kTestImagesFile), required_file(dir, kTestLabelsFile),
                         test_limit);
  if (val_split != 0) {
    auto split = split_validation(data.train, val_split);
    data.train = std::move(split.train);
    data.validation = std::move(split.validation);
  }
  return data;
}

TrainValidation split_validation(const Dataset& train, int64_t count) {
  const int64_t n = train.size();
  if (count < 0 || count >= n) {
    throw UsageError("--val-split " + std::to_string(count) + ": must be from 0 to " +
                     std::to_string(n - 1) + ", fewer than the " + std::to_string(n) +
                     " training images (after --train-limit), so that at least one trains");
  }
  if (count == 0) return {train, Dataset{}};
  Rng rng(kValidationSplitSeed);
  const std::vector<int64_t> order = random_permutation(n, rng);
  std::vector<bool> held_out(static_cast<size_t>(n), false);
  for (size_t i = 0; i < static_cast<size_t>(count); ++i) {
    held_out[static_cast<size_t>(order[i])] = true;
  }
  std::vector<int64_t> kept, held;  // both ascending: the original order
  for (int64_t i = 0; i < n; ++i) (held_out[static_cast<size_t>(i)] ? held : kept).push_back(i);
  const auto subset = [&train](const std::vector<int64_t>& indices) {
    const auto index = torch::tensor(indices, torch::kInt64).to(train.labels.device());
    return Dataset{train.images.index_select(0, index), train.labels.index_select(0, index)};
  };
  return {subset(kept), subset(held)};
}

std::string dataset_digest(const Dataset& set) {
  Sha256 hash;
  const auto sizes = std::to_string(set.images.defined() ? set.images.numel() : 0) + " " +
                     std::to_string(set.size()) + "\n";
  hash.update(sizes);
  for (const auto& tensor : {set.images, set.labels}) {
    if (!tensor.defined() || tensor.numel() == 0) continue;
    const auto bytes = tensor.to(torch::kCPU).contiguous();
    hash.update(bytes.data_ptr(), static_cast<size_t>(bytes.numel()) * bytes.element_size());
  }
  return hash.hex_digest();
}

torch::Tensor to_model_input(const torch::Tensor& images) {
  TORCH_CHECK(images.dim() == 3 && images.scalar_type() == torch::kUInt8,
              "to_model_input expects (N, 28, 28) uint8 images, got ", images.sizes(), " ",
              images.scalar_type());
  // Pixels scaled to [0, 1] and nothing else, as in the book (ToTensor without normalisation).
  return images.unsqueeze(1).to(torch::kFloat32).div_(255.0f);
}

}  // namespace dptrain
