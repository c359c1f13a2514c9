// Tests of data.h: finding the data directory (flag, $DPTRAIN_DATA, default places), loading and
// validating a split from tiny IDX files written here, holding out a validation split, turning
// images into model input, and, when it is installed, the real Fashion-MNIST (sizes, label
// range, the first labels).

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <torch/cuda.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "dptrain/data/data.h"
#include "dptrain/core/errors.h"
#include "support/data_support.h"
#include "support/test_support.h"

namespace {

using namespace dptrain;
using dptrain::testing::expect_data_error;
using dptrain::testing::gzip_bytes;
using dptrain::testing::make_idx;
using dptrain::testing::real_data_dir;
using dptrain::testing::TempDir;
using dptrain::testing::write_bytes;

constexpr uint8_t kIdxUnsignedByte = 0x08;
constexpr int64_t kPixels = kImageSide * kImageSide;

// Sets (or, with nullopt, unsets) an environment variable for the life of the guard.
class EnvGuard {
 public:
  EnvGuard(std::string name, const std::optional<std::string>& value) : name_(std::move(name)) {
    if (const char* old = std::getenv(name_.c_str())) old_ = old;
    if (value) {
      setenv(name_.c_str(), value->c_str(), 1);
    } else {
      unsetenv(name_.c_str());
    }
  }
  ~EnvGuard() {
    if (old_) {
      setenv(name_.c_str(), old_->c_str(), 1);
    } else {
      unsetenv(name_.c_str());
    }
  }
  EnvGuard(const EnvGuard&) = delete;
  EnvGuard& operator=(const EnvGuard&) = delete;

 private:
  std::string name_;
  std::optional<std::string> old_;
};

// Changes the working directory for the life of the guard.
class CwdGuard {
 public:
  explicit CwdGuard(const std::string& dir) : old_(dptrain::testing::current_directory()) {
    dptrain::testing::change_directory(dir);
  }
  ~CwdGuard() {
    try {
      dptrain::testing::change_directory(old_);
    } catch (const std::exception&) {
      // A destructor must not throw; the next test starts wherever it was.
    }
  }
  CwdGuard(const CwdGuard&) = delete;
  CwdGuard& operator=(const CwdGuard&) = delete;

 private:
  std::string old_;
};

// Pixel bytes of `n` images: a pattern that differs between images and positions.
std::vector<uint8_t> image_bytes(int64_t n, int salt = 0) {
  std::vector<uint8_t> bytes(static_cast<size_t>(n * kPixels));
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 7 + 3 + salt);
  return bytes;
}

void write_idx(const std::string& path, const std::vector<uint32_t>& dims,
               const std::vector<uint8_t>& data, bool gzip) {
  const auto bytes = make_idx(kIdxUnsignedByte, dims, data);
  write_bytes(path, gzip ? gzip_bytes(bytes) : bytes);
}

void write_images(const std::string& path, const std::vector<uint8_t>& pixels, bool gzip = true) {
  write_idx(path, {static_cast<uint32_t>(pixels.size() / kPixels), 28, 28}, pixels, gzip);
}

void write_labels(const std::string& path, const std::vector<uint8_t>& labels, bool gzip = true) {
  write_idx(path, {static_cast<uint32_t>(labels.size())}, labels, gzip);
}

// The published name without ".gz".
std::string unpacked(const char* gz_name) {
  const std::string name = gz_name;
  return name.substr(0, name.size() - 3);
}

const std::vector<uint8_t> kTrainLabels{9, 0, 0, 3, 0};
const std::vector<uint8_t> kTestLabels{9, 2, 1};

// A fake data directory: 5 training and 3 test examples; `gzip` picks the published names and
// compressed files, otherwise the unpacked names and plain files.
void write_fake_dataset(const std::string& dir, bool gzip) {
  auto name = [gzip](const char* gz_name) { return gzip ? gz_name : unpacked(gz_name); };
  write_images(dir + "/" + name(kTrainImagesFile), image_bytes(5, 0), gzip);
  write_labels(dir + "/" + name(kTrainLabelsFile), kTrainLabels, gzip);
  write_images(dir + "/" + name(kTestImagesFile), image_bytes(3, 100), gzip);
  write_labels(dir + "/" + name(kTestLabelsFile), kTestLabels, gzip);
}

torch::Tensor as_uint8_tensor(const std::vector<uint8_t>& bytes, std::vector<int64_t> shape) {
  return torch::tensor(std::vector<int64_t>(bytes.begin(), bytes.end()), torch::kInt64)
      .to(torch::kUInt8)
      .reshape(shape);
}

std::vector<int64_t> as_vector(const torch::Tensor& labels) {
  const auto contiguous = labels.contiguous();
  const int64_t* begin = contiguous.data_ptr<int64_t>();
  return std::vector<int64_t>(begin, begin + contiguous.numel());
}

// ---------------------------------------------------------------------------------------------
// load_split

TEST(DataLoadSplit, KeepsImageBytesAndLabelsExactly) {
  TempDir dir;
  const auto pixels = image_bytes(5);
  write_images(dir.file("images.gz"), pixels);
  write_labels(dir.file("labels.gz"), kTrainLabels);
  const Dataset split = load_split(dir.file("images.gz"), dir.file("labels.gz"));
  EXPECT_EQ(split.size(), 5);
  ASSERT_EQ(split.images.scalar_type(), torch::kUInt8);
  EXPECT_EQ(split.images.sizes(), (std::vector<int64_t>{5, 28, 28}));
  EXPECT_TRUE(torch::equal(split.images, as_uint8_tensor(pixels, {5, 28, 28})));
  ASSERT_EQ(split.labels.scalar_type(), torch::kInt64);
  EXPECT_EQ(split.labels.sizes(), (std::vector<int64_t>{5}));
  EXPECT_EQ(as_vector(split.labels), (std::vector<int64_t>{9, 0, 0, 3, 0}));
}

TEST(DataLoadSplit, PlainAndGzipFilesGiveEqualTensors) {
  TempDir dir;
  const auto pixels = image_bytes(4);
  const std::vector<uint8_t> labels{1, 2, 3, 4};
  write_images(dir.file("images.gz"), pixels, true);
  write_labels(dir.file("labels.gz"), labels, true);
  write_images(dir.file("images"), pixels, false);
  write_labels(dir.file("labels"), labels, false);
  const Dataset packed = load_split(dir.file("images.gz"), dir.file("labels.gz"));
  const Dataset plain = load_split(dir.file("images"), dir.file("labels"));
  EXPECT_TRUE(torch::equal(packed.images, plain.images));
  EXPECT_TRUE(torch::equal(packed.labels, plain.labels));
}

TEST(DataLoadSplit, EveryLabelValueSurvives) {
  TempDir dir;
  const std::vector<uint8_t> labels{0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
  write_images(dir.file("images.gz"), image_bytes(10));
  write_labels(dir.file("labels.gz"), labels);
  const Dataset split = load_split(dir.file("images.gz"), dir.file("labels.gz"));
  EXPECT_EQ(as_vector(split.labels), (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
}

TEST(DataLoadSplit, LimitKeepsTheFirstExamplesInOrder) {
  TempDir dir;
  const auto pixels = image_bytes(5);
  write_images(dir.file("images.gz"), pixels);
  write_labels(dir.file("labels.gz"), kTrainLabels);
  const Dataset full = load_split(dir.file("images.gz"), dir.file("labels.gz"));
  const Dataset two = load_split(dir.file("images.gz"), dir.file("labels.gz"), 2);
  EXPECT_EQ(two.size(), 2);
  EXPECT_EQ(two.images.sizes(), (std::vector<int64_t>{2, 28, 28}));
  EXPECT_TRUE(torch::equal(two.images, full.images.narrow(0, 0, 2)));
  EXPECT_TRUE(torch::equal(two.images, as_uint8_tensor(pixels, {5, 28, 28}).narrow(0, 0, 2)));
  EXPECT_EQ(as_vector(two.labels), (std::vector<int64_t>{9, 0}));
}

TEST(DataLoadSplit, LimitZeroNegativeOrTooLargeKeepsEverything) {
  TempDir dir;
  write_images(dir.file("images.gz"), image_bytes(5));
  write_labels(dir.file("labels.gz"), kTrainLabels);
  const Dataset full = load_split(dir.file("images.gz"), dir.file("labels.gz"));
  for (int64_t limit : {0, -1, 5, 6, 1000}) {
    SCOPED_TRACE("limit " + std::to_string(limit));
    const Dataset split = load_split(dir.file("images.gz"), dir.file("labels.gz"), limit);
    EXPECT_EQ(split.size(), 5);
    EXPECT_TRUE(torch::equal(split.images, full.images));
    EXPECT_TRUE(torch::equal(split.labels, full.labels));
  }
}

TEST(DataLoadSplit, CountMismatchNamesBothFiles) {
  TempDir dir;
  write_images(dir.file("images.gz"), image_bytes(3));
  write_labels(dir.file("labels.gz"), {1, 2});
  expect_data_error(
      [&] { load_split(dir.file("images.gz"), dir.file("labels.gz")); },
      {dir.file("images.gz") + " holds 3 images", dir.file("labels.gz") + " holds 2 labels"});
}

TEST(DataLoadSplit, LabelsThatAreNotOneDimensionalAreRejected) {
  TempDir dir;
  write_images(dir.file("images.gz"), image_bytes(2));
  write_idx(dir.file("labels.gz"), {2, 1}, {1, 2}, true);
  expect_data_error([&] { load_split(dir.file("images.gz"), dir.file("labels.gz")); },
                    {dir.file("labels.gz"), "labels have shape (2, 1), expected (N)"});
}

TEST(DataLoadSplit, LabelTenIsRejectedWithItsIndex) {
  TempDir dir;
  write_images(dir.file("images.gz"), image_bytes(4));
  write_labels(dir.file("labels.gz"), {0, 9, 10, 3});
  expect_data_error([&] { load_split(dir.file("images.gz"), dir.file("labels.gz")); },
                    {dir.file("labels.gz"), "label 10 at index 2 is outside 0..9"});
}

TEST(DataLoadSplit, Label255IsRejectedWithItsIndex) {
  TempDir dir;
  write_images(dir.file("images.gz"), image_bytes(2));
  write_labels(dir.file("labels.gz"), {0, 255});
  expect_data_error([&] { load_split(dir.file("images.gz"), dir.file("labels.gz")); },
                    {dir.file("labels.gz"), "label 255 at index 1"});
}

TEST(DataLoadSplit, CorruptFileErrorsPassThroughWithThePath) {
  TempDir dir;
  write_images(dir.file("images.gz"), image_bytes(2));
  write_bytes(dir.file("labels.gz"), {0x12, 0x34, 0x08, 0x01});
  expect_data_error([&] { load_split(dir.file("images.gz"), dir.file("labels.gz")); },
                    {dir.file("labels.gz"), "bad magic number"});
  expect_data_error([&] { load_split(dir.file("missing.gz"), dir.file("labels.gz")); },
                    {dir.file("missing.gz"), "cannot open"});
}

// An images file of the wrong shape: its dimensions and the shape the message must show.
struct BadImageShape {
  std::string name;
  std::vector<uint32_t> dims;
  std::string shown;
};

std::ostream& operator<<(std::ostream& out, const BadImageShape& c) { return out << c.name; }

class DataBadImageShape : public ::testing::TestWithParam<BadImageShape> {};

TEST_P(DataBadImageShape, IsRejectedNamingTheFileAndShape) {
  TempDir dir;
  const auto& dims = GetParam().dims;
  uint32_t elements = 1;
  for (uint32_t d : dims) elements *= d;
  write_idx(dir.file("images.gz"), dims, std::vector<uint8_t>(elements, 1), true);
  write_labels(dir.file("labels.gz"), {1, 2});
  expect_data_error(
      [&] { load_split(dir.file("images.gz"), dir.file("labels.gz")); },
      {dir.file("images.gz"), "images have shape " + GetParam().shown, "expected (N, 28, 28)"});
}

INSTANTIATE_TEST_SUITE_P(
    DataShapes, DataBadImageShape,
    ::testing::Values(BadImageShape{"one_dimension", {2}, "(2)"},
                      BadImageShape{"two_dimensions", {2, 784}, "(2, 784)"},
                      BadImageShape{"narrow", {2, 28, 27}, "(2, 28, 27)"},
                      BadImageShape{"short", {2, 27, 28}, "(2, 27, 28)"},
                      BadImageShape{"transposed_mnist_like", {28, 28, 2}, "(28, 28, 2)"},
                      BadImageShape{"with_channel", {2, 1, 28, 28}, "(2, 1, 28, 28)"}),
    [](const ::testing::TestParamInfo<BadImageShape>& info) { return info.param.name; });

// ---------------------------------------------------------------------------------------------
// to_model_input

TEST(DataModelInput, ScalesToUnitIntervalExactly) {
  auto images = torch::zeros({2, 28, 28}, torch::kUInt8);
  images[0][0][0] = 255;
  images[0][0][1] = 51;
  images[0][5][7] = 1;
  images[1][27][27] = 128;
  const auto input = to_model_input(images);
  ASSERT_EQ(input.scalar_type(), torch::kFloat32);
  ASSERT_EQ(input.sizes(), (std::vector<int64_t>{2, 1, 28, 28}));
  EXPECT_EQ(input[0][0][0][0].item<float>(), 1.0f);
  EXPECT_EQ(input[0][0][0][1].item<float>(), 0.2f);
  EXPECT_EQ(input[0][0][0][1].item<float>(), 51.0f / 255.0f);
  EXPECT_EQ(input[0][0][5][7].item<float>(), 1.0f / 255.0f);
  EXPECT_EQ(input[1][0][27][27].item<float>(), 128.0f / 255.0f);
  EXPECT_EQ(input[0][0][1][1].item<float>(), 0.0f);
  // Everything else is 0: the sum (rounded in a different order) is that of the four pixels.
  EXPECT_FLOAT_EQ(input.sum().item<float>(), (255.0f + 51.0f + 1.0f + 128.0f) / 255.0f);
  EXPECT_EQ(input.count_nonzero().item<int64_t>(), 4);
}

TEST(DataModelInput, EveryByteValueMapsToValueOver255) {
  auto values = torch::arange(256, torch::kInt64).to(torch::kUInt8);
  auto images = torch::zeros({1, 28, 28}, torch::kUInt8);
  images.view({-1}).narrow(0, 0, 256).copy_(values);
  const auto input = to_model_input(images).view({-1});
  for (int v = 0; v < 256; ++v) {
    EXPECT_EQ(input[v].item<float>(), static_cast<float>(v) / 255.0f) << "byte " << v;
  }
}

TEST(DataModelInput, LeavesTheImagesUnchanged) {
  const auto pixels = image_bytes(3);
  const auto images = as_uint8_tensor(pixels, {3, 28, 28});
  const auto copy = images.clone();
  const auto input = to_model_input(images);
  EXPECT_TRUE(torch::equal(images, copy));
  EXPECT_EQ(images.scalar_type(), torch::kUInt8);
  EXPECT_TRUE(torch::equal(input.squeeze(1), images.to(torch::kFloat32) / 255.0f));
}

TEST(DataModelInput, NonContiguousInputGivesTheSameAsContiguous) {
  const auto images = as_uint8_tensor(image_bytes(4), {4, 28, 28});
  const auto strided = images.transpose(1, 2).narrow(0, 1, 2);  // a view with odd strides
  ASSERT_FALSE(strided.is_contiguous());
  EXPECT_TRUE(torch::equal(to_model_input(strided), to_model_input(strided.contiguous())));
}

TEST(DataModelInput, EmptyBatchKeepsItsShape) {
  const auto input = to_model_input(torch::zeros({0, 28, 28}, torch::kUInt8));
  EXPECT_EQ(input.sizes(), (std::vector<int64_t>{0, 1, 28, 28}));
  EXPECT_EQ(input.scalar_type(), torch::kFloat32);
}

TEST(DataModelInput, RejectsWrongTypeOrRank) {
  EXPECT_THROW(to_model_input(torch::zeros({2, 28, 28}, torch::kFloat32)), c10::Error);
  EXPECT_THROW(to_model_input(torch::zeros({2, 1, 28, 28}, torch::kUInt8)), c10::Error);
  EXPECT_THROW(to_model_input(torch::zeros({28, 28}, torch::kUInt8)), c10::Error);
}

TEST(DataModelInput, StaysOnTheInputsDevice) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device to check device placement";
  const auto cpu = as_uint8_tensor(image_bytes(2), {2, 28, 28});
  const auto input = to_model_input(cpu.to(torch::kCUDA));
  EXPECT_TRUE(input.is_cuda());
  EXPECT_TRUE(torch::equal(input.cpu(), to_model_input(cpu)));
}

// ---------------------------------------------------------------------------------------------
// resolve_data_dir

TEST(DataResolveDir, ExplicitDirWithGzipFilesIsReturned) {
  TempDir dir;
  write_fake_dataset(dir.path(), true);
  EnvGuard env("DPTRAIN_DATA", std::nullopt);
  EXPECT_EQ(resolve_data_dir(dir.path()), dir.path());
}

TEST(DataResolveDir, ExplicitDirWithUnpackedNamesIsReturned) {
  TempDir dir;
  write_fake_dataset(dir.path(), false);
  EXPECT_EQ(resolve_data_dir(dir.path()), dir.path());
}

TEST(DataResolveDir, FlagWinsOverTheEnvironment) {
  TempDir flag_dir, env_dir;
  write_fake_dataset(flag_dir.path(), true);
  write_fake_dataset(env_dir.path(), true);
  EnvGuard env("DPTRAIN_DATA", env_dir.path());
  EXPECT_EQ(resolve_data_dir(flag_dir.path()), flag_dir.path());
}

TEST(DataResolveDir, EnvironmentIsUsedWithoutTheFlag) {
  TempDir dir;
  write_fake_dataset(dir.path(), false);
  EnvGuard env("DPTRAIN_DATA", dir.path());
  EXPECT_EQ(resolve_data_dir(std::nullopt), dir.path());
}

TEST(DataResolveDir, EnvironmentWithoutTheFilesIsAnError) {
  TempDir dir;
  EnvGuard env("DPTRAIN_DATA", dir.path());
  expect_data_error([] { resolve_data_dir(std::nullopt); },
                    {"DPTRAIN_DATA=" + dir.path(), "does not hold the four Fashion-MNIST files",
                     "dataset-fashion-mnist"});
}

TEST(DataResolveDir, NonexistentFlagDirIsAnError) {
  TempDir dir;
  const std::string missing = dir.file("nowhere");
  expect_data_error([&] { resolve_data_dir(missing); },
                    {"--data-dir " + missing, "dataset-fashion-mnist", "DPTRAIN_DATA"});
}

// What may stand at a data file's name instead of a regular file, and how find_file names it.
struct OddFile {
  std::string kind;
  std::string named;
};

std::ostream& operator<<(std::ostream& out, const OddFile& c) { return out << c.kind; }

// Each odd thing at the published name (gzip data set) or at the unpacked one (plain data set).
class DataOddFile : public ::testing::TestWithParam<std::tuple<OddFile, bool>> {
 protected:
  // The data set with `file` replaced by the odd thing: the path it stands at.
  std::string plant(const char* file) {
    const auto& [odd, gzip] = GetParam();
    write_fake_dataset(dir_.path(), gzip);
    const std::string path = dir_.file(gzip ? std::string(file) : unpacked(file));
    dptrain::testing::remove_path(path);
    if (odd.kind == "fifo") {
      EXPECT_EQ(::mkfifo(path.c_str(), 0600), 0);
    }
    if (odd.kind == "directory") dptrain::testing::make_directories(path);
    // stat follows the link, as find_file does: a character device, not a symbolic link.
    if (odd.kind == "device") {
      EXPECT_EQ(::symlink("/dev/zero", path.c_str()), 0);
    }
    return path;
  }

  // The error names `path` and what it is; it is not "missing", and no package would help.
  void expect_named(const std::function<void()>& action, const std::string& path) {
    const std::string message = dptrain::testing::expect_throws<DataError>(
        action, {path + ": is " + std::get<0>(GetParam()).named + ", not a regular file"});
    for (const char* wrong : {"missing", "install", "does not hold"}) {
      EXPECT_EQ(message.find(wrong), std::string::npos) << message;
    }
  }

  TempDir dir_;
};

// A FIFO, a device or a directory at a data file's name was reported as missing, with advice
// to install a package. It is named for what it is, by the directory lookup and by the loader.
TEST_P(DataOddFile, IsNamedNeverMissing) {
  const std::string path = plant(kTrainLabelsFile);
  expect_named([&] { resolve_data_dir(dir_.path()); }, path);
  {
    EnvGuard env("DPTRAIN_DATA", dir_.path());
    expect_named([&] { resolve_data_dir(std::nullopt); }, path);
  }
  expect_named([&] { load_fashion_mnist(dir_.path()); }, path);
}

// Opened without blocking (a FIFO with no writer would hang a plain open for ever).
TEST_P(DataOddFile, ReadingItDirectlyDoesNotBlock) {
  const std::string labels = plant(kTestLabelsFile);
  const std::string images = dir_.file(std::get<1>(GetParam()) ? std::string(kTestImagesFile)
                                                               : unpacked(kTestImagesFile));
  expect_data_error([&] { load_split(images, labels); }, {labels});
}

INSTANTIATE_TEST_SUITE_P(
    DataFiles, DataOddFile,
    ::testing::Combine(::testing::Values(OddFile{"fifo", "a FIFO"},
                                         OddFile{"directory", "a directory"},
                                         OddFile{"device", "a character device"}),
                       ::testing::Bool()),
    [](const ::testing::TestParamInfo<std::tuple<OddFile, bool>>& info) {
      return std::get<0>(info.param).kind + (std::get<1>(info.param) ? "_gz" : "_unpacked");
    });

// A symbolic link to a regular file is a data file like any other.
TEST(DataResolveDir, SymbolicLinksToTheFilesWork) {
  TempDir real, linked;
  write_fake_dataset(real.path(), true);
  for (const char* name : {kTrainImagesFile, kTrainLabelsFile, kTestImagesFile, kTestLabelsFile}) {
    ASSERT_EQ(::symlink(real.file(name).c_str(), linked.file(name).c_str()), 0) << name;
  }
  EXPECT_EQ(resolve_data_dir(linked.path()), linked.path());
  EXPECT_EQ(load_fashion_mnist(linked.path()).train.size(), 5);
}

const std::string kDebianDir = "/usr/share/datasets/fashion-mnist";

bool have_debian_data() {
  return dptrain::testing::path_exists(kDebianDir + "/" + kTrainImagesFile);
}

// The binary looks in Debian's directory; the tests below give their own system directory, so
// that each step of the lookup is reached whether or not Debian's package is installed.
TEST(DataResolveDir, TheBinarysSystemDirIsDebians) {
  EXPECT_EQ(std::string(kSystemDataDir), kDebianDir);
  TempDir work;
  EnvGuard env("DPTRAIN_DATA", std::nullopt);
  CwdGuard cwd(work.path());
  if (have_debian_data()) {
    EXPECT_EQ(resolve_data_dir(std::nullopt), kDebianDir);
  } else {
    expect_data_error([] { resolve_data_dir(std::nullopt); }, {"found in " + kDebianDir + " or"});
  }
}

// Without flag or environment: the system directory when it holds the files, else
// ./data/fashion-mnist.
TEST(DataResolveDir, DefaultsToDebianThenTheLocalDir) {
  TempDir work, system, empty_system;
  dptrain::testing::make_directories(work.file("data/fashion-mnist"));
  write_fake_dataset(work.file("data/fashion-mnist"), true);
  write_fake_dataset(system.path(), true);
  EnvGuard env("DPTRAIN_DATA", std::nullopt);
  CwdGuard cwd(work.path());
  EXPECT_EQ(resolve_data_dir(std::nullopt, system.path()), system.path());
  EXPECT_EQ(resolve_data_dir(std::nullopt, empty_system.path()), "data/fashion-mnist");
  EXPECT_EQ(resolve_data_dir(std::nullopt, empty_system.file("not-there")), "data/fashion-mnist");
  // A system directory that lacks one file does not hide the local one.
  dptrain::testing::remove_path(system.file(kTestLabelsFile));
  EXPECT_EQ(resolve_data_dir(std::nullopt, system.path()), "data/fashion-mnist");
}

TEST(DataResolveDir, EmptyEnvironmentIsIgnored) {
  TempDir work, system, empty_system;
  dptrain::testing::make_directories(work.file("data/fashion-mnist"));
  write_fake_dataset(work.file("data/fashion-mnist"), false);
  write_fake_dataset(system.path(), false);
  EnvGuard env("DPTRAIN_DATA", std::string());
  CwdGuard cwd(work.path());
  EXPECT_EQ(resolve_data_dir(std::nullopt, system.path()), system.path());
  EXPECT_EQ(resolve_data_dir(std::nullopt, empty_system.path()), "data/fashion-mnist");
}

TEST(DataResolveDir, NoDataAnywhereSaysHowToGetIt) {
  TempDir work, empty_system;
  EnvGuard env("DPTRAIN_DATA", std::nullopt);
  CwdGuard cwd(work.path());
  for (const std::string& system : {empty_system.path(), empty_system.file("not-there")}) {
    SCOPED_TRACE(system);
    expect_data_error([&] { resolve_data_dir(std::nullopt, system); },
                      {"no Fashion-MNIST data found in " + system + " or ./data/fashion-mnist",
                       "dataset-fashion-mnist", "--data-dir", "DPTRAIN_DATA"});
  }
}

// Each of the four files missing in turn.
class DataMissingFile : public ::testing::TestWithParam<int> {};

const char* file_of(int index) {
  const char* const names[] = {kTrainImagesFile, kTrainLabelsFile, kTestImagesFile,
                               kTestLabelsFile};
  return names[index];
}

TEST_P(DataMissingFile, FlagDirIsRejectedSayingHowToGetTheFiles) {
  TempDir dir;
  write_fake_dataset(dir.path(), true);
  dptrain::testing::remove_path(dir.file(file_of(GetParam())));
  expect_data_error([&] { resolve_data_dir(dir.path()); },
                    {"--data-dir " + dir.path(), "does not hold the four Fashion-MNIST files",
                     "dataset-fashion-mnist"});
}

TEST_P(DataMissingFile, LoadingNamesTheMissingFile) {
  TempDir dir;
  write_fake_dataset(dir.path(), false);
  const std::string missing = file_of(GetParam());
  dptrain::testing::remove_path(dir.file(unpacked(missing.c_str())));
  expect_data_error([&] { load_fashion_mnist(dir.path()); },
                    {dir.path(), missing + " (or its unpacked form) is missing"});
}

INSTANTIATE_TEST_SUITE_P(DataFiles, DataMissingFile, ::testing::Values(0, 1, 2, 3));

// ---------------------------------------------------------------------------------------------
// load_fashion_mnist

TEST(DataLoadFashionMnist, LoadsBothSplitsOfAFakeDir) {
  for (bool gzip : {true, false}) {
    SCOPED_TRACE(gzip ? "gzip files" : "plain files");
    TempDir dir;
    write_fake_dataset(dir.path(), gzip);
    const FashionMnist data = load_fashion_mnist(dir.path());
    EXPECT_EQ(data.train.size(), 5);
    EXPECT_EQ(data.test.size(), 3);
    EXPECT_EQ(as_vector(data.train.labels), (std::vector<int64_t>{9, 0, 0, 3, 0}));
    EXPECT_EQ(as_vector(data.test.labels), (std::vector<int64_t>{9, 2, 1}));
    EXPECT_TRUE(torch::equal(data.train.images, as_uint8_tensor(image_bytes(5, 0), {5, 28, 28})));
    EXPECT_TRUE(torch::equal(data.test.images, as_uint8_tensor(image_bytes(3, 100), {3, 28, 28})));
  }
}

TEST(DataLoadFashionMnist, LimitsApplyToEachSplit) {
  TempDir dir;
  write_fake_dataset(dir.path(), true);
  const FashionMnist data = load_fashion_mnist(dir.path(), 4, 1);
  EXPECT_EQ(as_vector(data.train.labels), (std::vector<int64_t>{9, 0, 0, 3}));
  EXPECT_EQ(as_vector(data.test.labels), (std::vector<int64_t>{9}));
  EXPECT_EQ(data.train.images.size(0), 4);
  EXPECT_EQ(data.test.images.size(0), 1);
}

TEST(DataLoadFashionMnist, PublishedNameIsPreferredOverTheUnpackedOne) {
  TempDir dir;
  write_fake_dataset(dir.path(), true);
  write_labels(dir.file(unpacked(kTrainLabelsFile)), {1, 1, 1, 1, 1}, false);
  const FashionMnist data = load_fashion_mnist(dir.path());
  EXPECT_EQ(as_vector(data.train.labels), (std::vector<int64_t>{9, 0, 0, 3, 0}));
}

// ---------------------------------------------------------------------------------------------
// split_validation and --val-split

// `n` images whose first two pixels spell their index (low byte, high byte), labelled index % 10.
Dataset numbered_images(int64_t n) {
  Dataset set;
  set.images = torch::zeros({n, kImageSide, kImageSide}, torch::kUInt8);
  for (int64_t i = 0; i < n; ++i) {
    set.images[i][0][0] = static_cast<int64_t>(i % 256);
    set.images[i][0][1] = static_cast<int64_t>(i / 256);
  }
  set.labels = torch::arange(n, torch::kInt64).remainder(10);
  return set;
}

// The indices a numbered set holds, read back from its pixels, checked against its labels.
std::vector<int64_t> indices_of(const Dataset& set) {
  std::vector<int64_t> indices;
  for (int64_t i = 0; i < set.size(); ++i) {
    const auto pixels = set.images[i][0].to(torch::kInt64);
    indices.push_back(pixels[0].item<int64_t>() + 256 * pixels[1].item<int64_t>());
    EXPECT_EQ(set.labels[i].item<int64_t>(), indices.back() % 10);
  }
  return indices;
}

// The held-out images are pinned: the first of a Fisher-Yates permutation drawn with SplitMix64
// from kValidationSplitSeed, computed independently in Python. The two parts are disjoint, cover
// the set, keep its order, and are the same on every call: split_validation takes no seed, so
// --seed and the world size cannot change them.
TEST(DataValidationSplit, HoldsOutThePinnedImagesDisjointAndInOrder) {
  const Dataset set = numbered_images(300);
  const TrainValidation split = split_validation(set, 5);
  const std::vector<int64_t> held{5, 15, 129, 222, 247};
  EXPECT_EQ(indices_of(split.validation), held);
  std::vector<int64_t> kept;
  for (int64_t i = 0; i < 300; ++i) {
    if (std::find(held.begin(), held.end(), i) == held.end()) kept.push_back(i);
  }
  EXPECT_EQ(indices_of(split.train), kept);
  EXPECT_EQ(split.train.images.sizes(), (std::vector<int64_t>{295, 28, 28}));
  const TrainValidation again = split_validation(set, 5);
  EXPECT_TRUE(torch::equal(again.train.images, split.train.images));
  EXPECT_TRUE(torch::equal(again.validation.images, split.validation.images));
  EXPECT_TRUE(torch::equal(again.validation.labels, split.validation.labels));
  // Another size draws another permutation, pinned too.
  EXPECT_EQ(indices_of(split_validation(numbered_images(320), 20).validation),
            (std::vector<int64_t>{15, 22, 33, 83, 98, 117, 141, 143, 163, 181, 224, 256, 260,
                                  263, 285, 288, 294, 297, 298, 303}));
}

TEST(DataValidationSplit, ZeroHoldsOutNothing) {
  const Dataset set = numbered_images(12);
  const TrainValidation split = split_validation(set, 0);
  EXPECT_TRUE(torch::equal(split.train.images, set.images));
  EXPECT_TRUE(torch::equal(split.train.labels, set.labels));
  EXPECT_EQ(split.validation.size(), 0);
  EXPECT_FALSE(split.validation.images.defined());
}

TEST(DataValidationSplit, OutOfRangeIsAUsageErrorNamingTheFlag) {
  const Dataset set = numbered_images(12);
  for (const int64_t count : {int64_t{-1}, int64_t{12}, int64_t{13}}) {
    const std::string message = dptrain::testing::expect_throws<UsageError>(
        [&] { split_validation(set, count); }, {});
    EXPECT_EQ(message, "--val-split " + std::to_string(count) +
                           ": must be from 0 to 11, fewer than the 12 training images (after "
                           "--train-limit), so that at least one trains");
  }
}

TEST(DataLoadFashionMnist, ValSplitHoldsOutOfWhatTheLimitLeaves) {
  TempDir dir;
  write_fake_dataset(dir.path(), true);
  const FashionMnist all = load_fashion_mnist(dir.path(), 0, 0, 2);  // 5 images: 1 and 2 held
  EXPECT_EQ(as_vector(all.train.labels), (std::vector<int64_t>{9, 3, 0}));
  EXPECT_EQ(as_vector(all.validation.labels), (std::vector<int64_t>{0, 0}));
  EXPECT_TRUE(torch::equal(all.validation.images,
                           as_uint8_tensor(image_bytes(5, 0), {5, 28, 28}).narrow(0, 1, 2)));
  const FashionMnist limited = load_fashion_mnist(dir.path(), 4, 0, 2);  // 4 images: 2 and 3
  EXPECT_EQ(as_vector(limited.train.labels), (std::vector<int64_t>{9, 0}));
  EXPECT_EQ(as_vector(limited.validation.labels), (std::vector<int64_t>{0, 3}));
  EXPECT_EQ(load_fashion_mnist(dir.path()).validation.size(), 0);
  dptrain::testing::expect_throws<UsageError>(
      [&] { load_fashion_mnist(dir.path(), 4, 0, 4); },
      {"--val-split 4: must be from 0 to 3, fewer than the 4 training images"});
}

// ---------------------------------------------------------------------------------------------
// The real Fashion-MNIST (Debian's dataset-fashion-mnist, $DPTRAIN_DATA or ./data/fashion-mnist)

TEST(DataRealFashionMnist, SizesLabelsAndFirstExamples) {
  const auto dir = real_data_dir();
  if (!dir) GTEST_SKIP() << "the real Fashion-MNIST is not installed (dataset-fashion-mnist)";
  const FashionMnist data = load_fashion_mnist(*dir);
  ASSERT_EQ(data.train.size(), 60000);
  ASSERT_EQ(data.test.size(), 10000);
  EXPECT_EQ(data.train.images.sizes(), (std::vector<int64_t>{60000, 28, 28}));
  EXPECT_EQ(data.test.images.sizes(), (std::vector<int64_t>{10000, 28, 28}));
  EXPECT_EQ(data.train.labels.min().item<int64_t>(), 0);
  EXPECT_EQ(data.train.labels.max().item<int64_t>(), 9);
  // Read independently with Python's gzip module.
  EXPECT_EQ(as_vector(data.train.labels.narrow(0, 0, 10)),
            (std::vector<int64_t>{9, 0, 0, 3, 0, 2, 7, 2, 5, 5}));
  EXPECT_EQ(as_vector(data.test.labels.narrow(0, 0, 10)),
            (std::vector<int64_t>{9, 2, 1, 1, 6, 1, 4, 6, 5, 7}));
  // Balanced classes: 6,000 per class in training, 1,000 in test.
  EXPECT_TRUE(
      torch::equal(torch::bincount(data.train.labels), torch::full({10}, 6000, torch::kInt64)));
  EXPECT_TRUE(
      torch::equal(torch::bincount(data.test.labels), torch::full({10}, 1000, torch::kInt64)));
  // The first training image (an ankle boot): pixel sum and one row, also read with Python.
  EXPECT_EQ(data.train.images[0].to(torch::kInt64).sum().item<int64_t>(), 76247);
  const std::vector<uint8_t> row10{0,    0,    0,    0,    0,    0,    0,    0,    0,    0,
                                   0,    0,    0,    0xc1, 0xe4, 0xda, 0xd5, 0xc6, 0xb4, 0xd4,
                                   0xd2, 0xd3, 0xd5, 0xdf, 0xdc, 0xf3, 0xca, 0};
  EXPECT_TRUE(torch::equal(data.train.images[0][10], as_uint8_tensor(row10, {28})));
}

TEST(DataRealFashionMnist, LimitEqualsThePrefixOfTheFullSplit) {
  const auto dir = real_data_dir();
  if (!dir) GTEST_SKIP() << "the real Fashion-MNIST is not installed (dataset-fashion-mnist)";
  const FashionMnist full = load_fashion_mnist(*dir, 0, 0);
  const FashionMnist small = load_fashion_mnist(*dir, 1000, 300);
  EXPECT_TRUE(torch::equal(small.train.images, full.train.images.narrow(0, 0, 1000)));
  EXPECT_TRUE(torch::equal(small.train.labels, full.train.labels.narrow(0, 0, 1000)));
  EXPECT_TRUE(torch::equal(small.test.images, full.test.images.narrow(0, 0, 300)));
  EXPECT_TRUE(torch::equal(small.test.labels, full.test.labels.narrow(0, 0, 300)));
}

}  // namespace
