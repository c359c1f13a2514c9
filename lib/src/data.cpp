// Fashion-MNIST: locating, loading and validating the four IDX files. See data.h.
#include "dptrain/data.h"

#include <sys/stat.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "dptrain/idx.h"

namespace dptrain {

const char* const kTrainImagesFile = "train-images-idx3-ubyte.gz";
const char* const kTrainLabelsFile = "train-labels-idx1-ubyte.gz";
const char* const kTestImagesFile = "t10k-images-idx3-ubyte.gz";
const char* const kTestLabelsFile = "t10k-labels-idx1-ubyte.gz";

namespace {

constexpr const char* kDebianDataDir =
    "/usr/share/datasets/fashion-mnist";  // dataset-fashion-mnist
constexpr const char* kLocalDataDir = "data/fashion-mnist";

// POSIX stat rather than std::filesystem: PyPI's libtorch.so exports its own copy of the
// std::filesystem symbols, which then stand in for ours and have crashed.
bool is_regular_file(const std::string& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode);
}

// The published name, or the same without ".gz" (a user may have unpacked the files).
std::optional<std::string> find_file(const std::string& dir, const std::string& gz_name) {
  const std::string gz = dir + "/" + gz_name;
  if (is_regular_file(gz)) return gz;
  const std::string plain = gz.substr(0, gz.size() - 3);
  if (is_regular_file(plain)) return plain;
  return std::nullopt;
}

bool holds_all_files(const std::string& dir) {
  for (const char* name : {kTrainImagesFile, kTrainLabelsFile, kTestImagesFile, kTestLabelsFile}) {
    if (!find_file(dir, name)) return false;
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

std::string resolve_data_dir(const std::optional<std::string>& flag_value) {
  const char* kHowToGet =
      "install Debian's dataset-fashion-mnist (apt-get install dataset-fashion-mnist), or put "
      "the four Fashion-MNIST IDX files (train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, "
      "t10k-images-idx3-ubyte.gz, t10k-labels-idx1-ubyte.gz) in a directory and pass "
      "--data-dir or set DPTRAIN_DATA";
  if (flag_value) {
    if (!holds_all_files(*flag_value)) {
      throw DataError("--data-dir " + *flag_value +
                      ": does not hold the four Fashion-MNIST files; " + kHowToGet);
    }
    return *flag_value;
  }
  if (const char* env = std::getenv("DPTRAIN_DATA"); env && *env) {
    if (!holds_all_files(env)) {
      throw DataError(std::string("DPTRAIN_DATA=") + env +
                      ": does not hold the four Fashion-MNIST files; " + kHowToGet);
    }
    return env;
  }
  for (const char* dir : {kDebianDataDir, kLocalDataDir}) {
    if (holds_all_files(dir)) return dir;
  }
  throw DataError(std::string("no Fashion-MNIST data found in ") + kDebianDataDir + " or ./" +
                  kLocalDataDir + "; " + kHowToGet);
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
  int64_t n = images.dims[0];
  if (limit > 0 && limit < n) n = limit;
  Dataset split;
  split.images =
      torch::from_blob(images.data.data(), {images.dims[0], kImageSide, kImageSide}, torch::kUInt8)
          .narrow(0, 0, n)
          .clone();
  split.labels = torch::from_blob(labels.data.data(), {labels.dims[0]}, torch::kUInt8)
                     .narrow(0, 0, n)
                     .to(torch::kInt64);
  return split;
}

FashionMnist load_fashion_mnist(const std::string& dir, int64_t train_limit, int64_t test_limit) {
  FashionMnist data;
  data.train = load_split(required_file(dir, kTrainImagesFile),
                          required_file(dir, kTrainLabelsFile), train_limit);
  data.test = load_split(required_file(dir, kTestImagesFile), required_file(dir, kTestLabelsFile),
                         test_limit);
  return data;
}

torch::Tensor to_model_input(const torch::Tensor& images) {
  TORCH_CHECK(images.dim() == 3 && images.scalar_type() == torch::kUInt8,
              "to_model_input expects (N, 28, 28) uint8 images, got ", images.sizes(), " ",
              images.scalar_type());
  // Pixels scaled to [0, 1] and nothing else, as in the book (ToTensor without normalisation).
  return images.unsqueeze(1).to(torch::kFloat32).div_(255.0f);
}

}  // namespace dptrain
