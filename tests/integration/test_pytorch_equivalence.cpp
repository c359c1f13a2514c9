// dptrain::ResNet against the book's PyTorch ResNet-18 (fixture from make_pytorch_fixture.py):
// with the same weights and batch, one training step must give PyTorch's logits, loss, gradients
// and BatchNorm running statistics, and eval mode PyTorch's logits. Names must match one to one.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "dptrain/model/model.h"

namespace {

const char* const kFixturePath = DPTRAIN_TEST_DATA_DIR "/resnet18_w8_pytorch.bin";
constexpr int64_t kFixtureWidth = 8;  // the width make_pytorch_fixture.py builds
// float32 through ~20 layers: rounding differs with summation order, not with meaning.
constexpr double kRtol = 1e-4;
constexpr double kAtol = 1e-5;

// ---- Fixture reader (format documented in make_pytorch_fixture.py) ------------------------

class ByteReader {
 public:
  ByteReader(std::vector<unsigned char> bytes, std::string path)
      : bytes_(std::move(bytes)), path_(std::move(path)) {}

  bool at_end() const { return pos_ == bytes_.size(); }

  const unsigned char* take(size_t n, const char* what) {
    if (bytes_.size() - pos_ < n) {
      std::ostringstream message;
      message << path_ << ": truncated while reading " << what << " at byte " << pos_;
      throw std::runtime_error(message.str());
    }
    const unsigned char* p = bytes_.data() + pos_;
    pos_ += n;
    return p;
  }

  // Assembled byte by byte, so the reader does not depend on the host's byte order.
  uint64_t little_endian(size_t n, const char* what) {
    const unsigned char* p = take(n, what);
    uint64_t value = 0;
    for (size_t i = 0; i < n; ++i) value |= static_cast<uint64_t>(p[i]) << (8 * i);
    return value;
  }

  uint32_t u32(const char* what) { return static_cast<uint32_t>(little_endian(4, what)); }
  int64_t i64(const char* what) { return static_cast<int64_t>(little_endian(8, what)); }

 private:
  std::vector<unsigned char> bytes_;
  std::string path_;
  size_t pos_ = 0;
};

using Fixture = std::map<std::string, torch::Tensor>;

Fixture load_fixture(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw std::runtime_error(path +
                             ": cannot open (regenerate with "
                             "/usr/bin/python3 tests/support/make_pytorch_fixture.py)");
  }
  ByteReader reader(std::vector<unsigned char>(std::istreambuf_iterator<char>(in), {}), path);
  const unsigned char* magic = reader.take(8, "magic");
  if (std::memcmp(magic, "DPTFIX01", 8) != 0) {
    throw std::runtime_error(path + ": not a DPTFIX01 fixture");
  }
  Fixture fixture;
  const uint32_t count = reader.u32("entry count");
  for (uint32_t e = 0; e < count; ++e) {
    const uint32_t name_length = reader.u32("name length");
    const unsigned char* name_bytes = reader.take(name_length, "name");
    std::string name(reinterpret_cast<const char*>(name_bytes), name_length);
    const uint32_t ndim = reader.u32("ndim");
    std::vector<int64_t> dims;
    int64_t numel = 1;
    for (uint32_t d = 0; d < ndim; ++d) {
      dims.push_back(reader.i64("dims"));
      if (dims.back() < 0) throw std::runtime_error(path + ": negative dim in " + name);
      numel *= dims.back();
    }
    auto tensor = torch::empty(dims, torch::kFloat32);
    float* out = tensor.data_ptr<float>();
    for (int64_t i = 0; i < numel; ++i) {
      const auto bits = reader.u32(name.c_str());
      std::memcpy(&out[i], &bits, sizeof(float));
    }
    if (!fixture.emplace(name, tensor).second) {
      throw std::runtime_error(path + ": duplicate entry " + name);
    }
  }
  if (!reader.at_end()) throw std::runtime_error(path + ": trailing bytes after last entry");
  return fixture;
}

// Loaded once: every test reads the same file.
const Fixture& fixture() {
  static const Fixture loaded = load_fixture(kFixturePath);
  return loaded;
}

const torch::Tensor& entry(const std::string& name) {
  const auto it = fixture().find(name);
  if (it == fixture().end()) throw std::runtime_error("fixture has no entry " + name);
  return it->second;
}

// Fixture names under `prefix` ("param/"), with the prefix removed.
std::set<std::string> fixture_names(const std::string& prefix) {
  std::set<std::string> names;
  for (const auto& item : fixture()) {
    if (item.first.compare(0, prefix.size(), prefix) == 0) {
      names.insert(item.first.substr(prefix.size()));
    }
  }
  return names;
}

// The fixture stores running_mean/var only: num_batches_tracked is an integer counter that
// PyTorch's eval and momentum paths never read when momentum is set.
bool is_running_stat(const std::string& name) {
  auto ends_with = [&](const std::string& suffix) {
    return name.size() >= suffix.size() &&
           name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  return ends_with("running_mean") || ends_with("running_var");
}

std::set<std::string> running_stat_names(const dptrain::ResNet& model) {
  std::set<std::string> names;
  for (const auto& item : model->named_buffers()) {
    if (is_running_stat(item.key())) names.insert(item.key());
  }
  return names;
}

std::set<std::string> parameter_names(const dptrain::ResNet& model) {
  std::set<std::string> names;
  for (const auto& item : model->named_parameters()) names.insert(item.key());
  return names;
}

std::string join(const std::set<std::string>& names) {
  std::string joined;
  for (const auto& name : names) joined += (joined.empty() ? "" : ", ") + name;
  return joined.empty() ? "(none)" : joined;
}

// Names in `a` that are not in `b`.
std::set<std::string> missing_from(const std::set<std::string>& a, const std::set<std::string>& b) {
  std::set<std::string> missing;
  for (const auto& name : a) {
    if (b.count(name) == 0) missing.insert(name);
  }
  return missing;
}

// Compares one tensor, reports the worst element on failure, and returns the max abs difference
// so that callers can report the largest one per category.
double expect_close(const std::string& name, const torch::Tensor& actual,
                    const torch::Tensor& expected) {
  const auto a = actual.detach().to(torch::kFloat32).cpu();
  // PyTorch may write a scalar as shape [] and we accept [1] too; otherwise shapes must agree.
  const auto e = expected.numel() == 1 && a.numel() == 1 ? expected.reshape(a.sizes()) : expected;
  if (a.sizes() != e.sizes()) {
    ADD_FAILURE() << name << ": shape " << a.sizes() << ", PyTorch has " << e.sizes();
    return std::numeric_limits<double>::infinity();
  }
  const double max_abs = a.numel() == 0 ? 0.0 : (a - e).abs().max().item<double>();
  EXPECT_TRUE(torch::allclose(a, e, kRtol, kAtol))
      << name << ": max |C++ - PyTorch| = " << max_abs << " (largest |PyTorch| value "
      << e.abs().max().item<double>() << ")";
  return max_abs;
}

// Keeps the largest difference of a category and records it in the test's XML output.
struct MaxDiff {
  std::string category;
  double value = 0.0;
  void add(double d) { value = std::max(value, d); }
  ~MaxDiff() {
    std::ostringstream text;
    text << value;  // %g-style, so that 3e-07 does not print as 0.000000
    testing::Test::RecordProperty("max_abs_diff_" + category, text.str());
  }
};

// A width-8 model carrying the fixture's initial parameters and running statistics. Fails the
// test (and returns false) when a name exists on only one side or a shape differs.
bool load_model(dptrain::ResNet& model) {
  model =
      dptrain::ResNet(dptrain::ResNetOptions{/*num_classes=*/10, /*in_channels=*/1, kFixtureWidth});
  bool ok = true;
  const auto cpp_params = parameter_names(model);
  const auto py_params = fixture_names("param/");
  for (const auto& name : missing_from(cpp_params, py_params)) {
    ADD_FAILURE() << "C++ parameter " << name << " is not in the PyTorch fixture";
    ok = false;
  }
  for (const auto& name : missing_from(py_params, cpp_params)) {
    ADD_FAILURE() << "PyTorch parameter " << name << " is not in the C++ model";
    ok = false;
  }
  const auto cpp_buffers = running_stat_names(model);
  const auto py_buffers = fixture_names("buffer/");
  for (const auto& name : missing_from(cpp_buffers, py_buffers)) {
    ADD_FAILURE() << "C++ buffer " << name << " is not in the PyTorch fixture";
    ok = false;
  }
  for (const auto& name : missing_from(py_buffers, cpp_buffers)) {
    ADD_FAILURE() << "PyTorch buffer " << name << " is not in the C++ model";
    ok = false;
  }
  if (!ok) return false;

  torch::NoGradGuard no_grad;
  auto copy_in = [&](const std::string& name, torch::Tensor& target, const torch::Tensor& value) {
    if (target.sizes() != value.sizes()) {
      ADD_FAILURE() << name << ": C++ shape " << target.sizes() << ", PyTorch " << value.sizes();
      ok = false;
      return;
    }
    target.copy_(value);
  };
  for (auto& item : model->named_parameters()) {
    copy_in(item.key(), item.value(), entry("param/" + item.key()));
  }
  for (auto& item : model->named_buffers()) {
    if (is_running_stat(item.key())) {
      copy_in(item.key(), item.value(), entry("buffer/" + item.key()));
    }
  }
  return ok;
}

struct TrainStep {
  torch::Tensor logits, loss;
};

TrainStep run_train_step(dptrain::ResNet& model) {
  model->train();
  const auto labels = entry("labels").to(torch::kLong);  // stored as float, exact for 0..9
  TrainStep step;
  step.logits = model->forward(entry("input"));
  step.loss = torch::nn::functional::cross_entropy(step.logits, labels);  // mean reduction
  step.loss.backward();
  return step;
}

}  // namespace

TEST(PyTorchEquivalence, FixtureIsWellFormed) {
  ASSERT_NO_THROW(fixture()) << "cannot read " << kFixturePath;
  EXPECT_EQ(entry("input").sizes(), (std::vector<int64_t>{8, 1, 28, 28}));
  EXPECT_EQ(entry("labels").sizes(), (std::vector<int64_t>{8}));
  EXPECT_EQ(entry("train_logits").sizes(), (std::vector<int64_t>{8, 10}));
  EXPECT_EQ(entry("eval_logits").sizes(), (std::vector<int64_t>{8, 10}));
  // Every parameter has a gradient and every running statistic an updated value.
  EXPECT_EQ(fixture_names("param/"), fixture_names("grad/"));
  EXPECT_EQ(fixture_names("buffer/"), fixture_names("buffer_after/"));
}

TEST(PyTorchEquivalence, NamesMatchOneToOne) {
  ASSERT_NO_THROW(fixture()) << "cannot read " << kFixturePath;
  dptrain::ResNet model{nullptr};
  ASSERT_TRUE(load_model(model));
  // Not vacuous: the comparison above would pass on two empty sets.
  EXPECT_EQ(parameter_names(model).size(), fixture_names("param/").size());
  EXPECT_GT(parameter_names(model).size(), 60u) << join(parameter_names(model));
}

TEST(PyTorchEquivalence, TrainStepMatches) {
  ASSERT_NO_THROW(fixture()) << "cannot read " << kFixturePath;
  dptrain::ResNet model{nullptr};
  ASSERT_TRUE(load_model(model));
  const auto step = run_train_step(model);

  {
    MaxDiff diff{"train_logits"};
    diff.add(expect_close("train_logits", step.logits, entry("train_logits")));
  }
  {
    MaxDiff diff{"loss"};
    diff.add(expect_close("loss", step.loss, entry("loss")));
  }
  {
    MaxDiff diff{"grad"};
    for (const auto& item : model->named_parameters()) {
      const auto& grad = item.value().grad();
      if (!grad.defined()) {
        ADD_FAILURE() << "grad/" << item.key() << ": no gradient in C++";
        continue;
      }
      diff.add(expect_close("grad/" + item.key(), grad, entry("grad/" + item.key())));
    }
  }
  {
    MaxDiff diff{"buffer_after"};
    for (const auto& item : model->named_buffers()) {
      if (!is_running_stat(item.key())) continue;
      diff.add(expect_close("buffer_after/" + item.key(), item.value(),
                            entry("buffer_after/" + item.key())));
    }
  }
  // PyTorch counts one batch per training forward; the fixture leaves the counter out.
  for (const auto& item : model->named_buffers()) {
    if (item.key().size() >= 19 &&
        item.key().compare(item.key().size() - 19, 19, "num_batches_tracked") == 0) {
      EXPECT_EQ(item.value().item<int64_t>(), 1) << item.key();
    }
  }
}

TEST(PyTorchEquivalence, EvalAfterTrainStepMatches) {
  ASSERT_NO_THROW(fixture()) << "cannot read " << kFixturePath;
  dptrain::ResNet model{nullptr};
  ASSERT_TRUE(load_model(model));
  // As in the script: eval mode uses the running statistics the training forward updated.
  run_train_step(model);
  model->eval();
  torch::NoGradGuard no_grad;
  MaxDiff diff{"eval_logits"};
  diff.add(expect_close("eval_logits", model->forward(entry("input")), entry("eval_logits")));
}
