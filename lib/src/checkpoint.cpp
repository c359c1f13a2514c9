// The checkpoint file format, its atomic writer and its strict reader. See checkpoint.h.
#include "dptrain/train/checkpoint.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <map>
#include <sstream>

#include "dptrain/errors.h"
#include "dptrain/io/files.h"

namespace dptrain {
namespace {

constexpr char kMagic[8] = {'D', 'P', 'T', 'R', 'N', 'C', 'K', 'P'};
constexpr size_t kHeaderBytes = 8 + 4 + 8 + 4;
constexpr uint64_t kMaxTensors = 100000;  // far above any model dptrain builds
constexpr uint64_t kMaxRank = 8;
constexpr uint64_t kMaxName = 4096;
constexpr uint64_t kMaxEpochs = 1000000;
constexpr uint64_t kMaxDigest = 128;  // a hex SHA-256 is 64

// ---- Little-endian encoding --------------------------------------------------------------

class ByteWriter {
 public:
  void u32(uint32_t v) { put(v, 4); }
  void u64(uint64_t v) { put(v, 8); }
  void i64(int64_t v) { put(static_cast<uint64_t>(v), 8); }
  void f64(double v) {
    uint64_t bits;
    std::memcpy(&bits, &v, 8);
    put(bits, 8);
  }
  void text(const std::string& s) {
    u64(s.size());
    bytes_.insert(bytes_.end(), s.begin(), s.end());
  }
  void raw(const void* data, size_t size) {
    const auto* p = static_cast<const uint8_t*>(data);
    bytes_.insert(bytes_.end(), p, p + size);
  }
  std::vector<uint8_t>& bytes() { return bytes_; }

 private:
  void put(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) bytes_.push_back(static_cast<uint8_t>(v >> (8 * i)));
  }
  std::vector<uint8_t> bytes_;
};

// Every read is bounds-checked; running off the end is a DataError naming the file.
class ByteReader {
 public:
  ByteReader(const uint8_t* data, size_t size, const std::string& name)
      : data_(data), size_(size), name_(name) {}
  uint32_t u32() { return static_cast<uint32_t>(get(4)); }
  uint64_t u64() { return get(8); }
  int64_t i64() { return static_cast<int64_t>(get(8)); }
  double f64() {
    const uint64_t bits = get(8);
    double v;
    std::memcpy(&v, &bits, 8);
    return v;
  }
  std::string text(uint64_t max_size, const char* what) {
    const uint64_t n = u64();
    if (n > max_size) fail(std::string(what) + " of " + std::to_string(n) + " bytes");
    need(n);
    std::string s(reinterpret_cast<const char*>(data_ + offset_), n);
    offset_ += n;
    return s;
  }
  const uint8_t* raw(uint64_t n) {
    need(n);
    const uint8_t* p = data_ + offset_;
    offset_ += n;
    return p;
  }
  size_t remaining() const { return size_ - offset_; }
  [[noreturn]] void fail(const std::string& what) const {
    throw DataError("checkpoint " + name_ + ": corrupt: " + what + " at byte " +
                    std::to_string(offset_));
  }

 private:
  void need(uint64_t n) const {
    if (n > size_ - offset_) {
      throw DataError("checkpoint " + name_ + ": truncated: needs " + std::to_string(n) +
                      " more bytes at byte " + std::to_string(offset_) + " of " +
                      std::to_string(size_));
    }
  }
  uint64_t get(int n) {
    need(static_cast<uint64_t>(n));
    uint64_t v = 0;
    for (int i = 0; i < n; ++i) v |= static_cast<uint64_t>(data_[offset_ + i]) << (8 * i);
    offset_ += static_cast<size_t>(n);
    return v;
  }
  const uint8_t* data_;
  size_t size_;
  size_t offset_ = 0;
  const std::string& name_;
};

// The dtypes a model of ours holds; the codes are part of the file format.
uint32_t dtype_code(torch::ScalarType type) {
  switch (type) {
    case torch::kFloat32:
      return 1;
    case torch::kFloat64:
      return 2;
    case torch::kInt64:
      return 3;
    case torch::kBFloat16:
      return 4;
    case torch::kFloat16:
      return 5;
    default:
      TORCH_CHECK(false, "checkpoint: no code for dtype ", type);
  }
}

std::optional<torch::ScalarType> dtype_of_code(uint32_t code) {
  switch (code) {
    case 1:
      return torch::kFloat32;
    case 2:
      return torch::kFloat64;
    case 3:
      return torch::kInt64;
    case 4:
      return torch::kBFloat16;
    case 5:
      return torch::kFloat16;
    default:
      return std::nullopt;
  }
}

void write_stats(ByteWriter& w, const EpochStats& s) {
  w.i64(s.epoch);
  w.i64(s.epochs);
  w.f64(s.train_loss);
  w.f64(s.train_acc);
  w.f64(s.test_loss);
  w.f64(s.test_acc);
  w.f64(s.seconds);
  w.f64(s.images_per_second);
  w.i64(s.steps);
}

EpochStats read_stats(ByteReader& r) {
  EpochStats s;
  s.epoch = r.i64();
  s.epochs = r.i64();
  s.train_loss = r.f64();
  s.train_acc = r.f64();
  s.test_loss = r.f64();
  s.test_acc = r.f64();
  s.seconds = r.f64();
  s.images_per_second = r.f64();
  s.steps = r.i64();
  return s;
}

// One named tensor: name, dtype code, rank, dimensions, byte count, raw bytes. Every size is
// checked against what the file still holds before anything is allocated.
std::pair<std::string, torch::Tensor> read_tensor(ByteReader& r) {
  auto name = r.text(kMaxName, "tensor name");
  const auto dtype = dtype_of_code(r.u32());
  if (!dtype) r.fail("unknown dtype code in tensor " + name);
  const uint64_t rank = r.u64();
  if (rank > kMaxRank) r.fail("tensor " + name + " of rank " + std::to_string(rank));
  std::vector<int64_t> dims;
  uint64_t numel = 1;
  for (uint64_t d = 0; d < rank; ++d) {
    const int64_t size = r.i64();
    if (size < 0 ||
        (size > 0 && numel > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(size))) {
      r.fail("tensor " + name + " with bad dimension " + std::to_string(size));
    }
    numel *= static_cast<uint64_t>(size);
    dims.push_back(size);
  }
  const uint64_t element = c10::elementSize(*dtype);
  const uint64_t stored = r.u64();
  if (numel > r.remaining() / element || stored != numel * element) {
    r.fail("tensor " + name + " holds " + std::to_string(stored) + " bytes, its shape " +
           std::to_string(numel) + " elements");
  }
  const uint8_t* data = r.raw(stored);
  auto tensor = torch::empty(dims, torch::TensorOptions().dtype(*dtype));
  // An empty tensor has no storage to copy into (data_ptr() is null; memcpy forbids that).
  if (stored > 0) std::memcpy(tensor.data_ptr(), data, stored);
  return {std::move(name), std::move(tensor)};
}

// The CRC-32 a file's header must carry. Version 1 covered the payload alone, so a flipped bit in
// the version field read as "format version 257"; from version 2 on it covers the header's magic,
// version and payload size too, and a header that was damaged reads as corrupt.
uint32_t file_crc(uint32_t version, const uint8_t* file, size_t payload_size) {
  const uint8_t* payload = file + kHeaderBytes;
  uLong crc = ::crc32(0L, Z_NULL, 0);
  if (version >= 2) crc = ::crc32(crc, file, static_cast<uInt>(kHeaderBytes - 4));
  return static_cast<uint32_t>(::crc32(crc, payload, static_cast<uInt>(payload_size)));
}

}  // namespace

// ---- Serialisation ---------------------------------------------------------------------

std::vector<uint8_t> serialize_checkpoint(const Checkpoint& c) {
  ByteWriter payload;
  payload.i64(c.config.width);
  payload.i64(c.config.num_classes);
  payload.i64(c.config.in_channels);
  payload.i64(c.config.batch_size);
  payload.f64(c.config.lr);
  payload.u64(c.config.seed);
  payload.i64(c.config.train_size);
  payload.i64(c.config.world_size);
  if (c.format_version >= 2) payload.text(c.config.train_digest);
  payload.i64(c.epochs_done);
  payload.i64(c.step_in_epoch);
  payload.i64(c.global_step);
  payload.f64(c.partial_sums.loss_sum);
  payload.f64(c.partial_sums.correct);
  payload.f64(c.partial_sums.count);
  payload.f64(c.partial_seconds);
  payload.u64(c.history.size());
  for (const auto& s : c.history) write_stats(payload, s);
  payload.u64(c.tensors.size());
  for (const auto& [name, tensor] : c.tensors) {
    const auto t = tensor.detach().to(torch::kCPU).contiguous();
    payload.text(name);
    payload.u32(dtype_code(t.scalar_type()));
    payload.u64(static_cast<uint64_t>(t.dim()));
    for (int64_t d : t.sizes()) payload.i64(d);
    const auto size = static_cast<uint64_t>(t.numel()) * t.element_size();
    payload.u64(size);
    payload.raw(t.data_ptr(), size);
  }

  TORCH_CHECK(c.format_version == 1 || c.format_version == kCheckpointFormatVersion,
              "checkpoint: cannot write format version ", c.format_version);
  ByteWriter file;
  file.raw(kMagic, sizeof kMagic);
  file.u32(c.format_version);
  file.u64(payload.bytes().size());
  file.u32(0);  // the CRC-32, filled in below
  file.raw(payload.bytes().data(), payload.bytes().size());
  auto& bytes = file.bytes();
  const uint32_t crc = file_crc(c.format_version, bytes.data(), payload.bytes().size());
  for (int i = 0; i < 4; ++i) bytes[kHeaderBytes - 4 + i] = static_cast<uint8_t>(crc >> (8 * i));
  return std::move(bytes);
}

Checkpoint parse_checkpoint(const std::vector<uint8_t>& bytes, const std::string& name) {
  if (bytes.size() < sizeof kMagic || std::memcmp(bytes.data(), kMagic, sizeof kMagic) != 0) {
    throw DataError("checkpoint " + name + ": not a dptrain checkpoint (no DPTRNCKP header)");
  }
  ByteReader header(bytes.data(), bytes.size(), name);
  header.raw(sizeof kMagic);
  const uint32_t version = header.u32();
  const uint64_t payload_size = header.u64();
  const uint32_t crc = header.u32();
  if (payload_size != header.remaining()) {
    throw DataError("checkpoint " + name + ": truncated or padded: the header promises " +
                    std::to_string(payload_size) + " bytes of payload, the file has " +
                    std::to_string(header.remaining()));
  }
  const uint8_t* payload = bytes.data() + kHeaderBytes;
  // zlib takes the length as uInt; a checkpoint of ours is far below 4 GiB, but check anyway.
  if (payload_size > std::numeric_limits<uInt>::max()) {
    throw DataError("checkpoint " + name + ": payload of " + std::to_string(payload_size) +
                    " bytes is larger than dptrain writes");
  }
  // The CRC first: only a header that is intact may claim a version this dptrain does not know.
  // Later versions keep version 2's CRC, which covers the version field.
  if (file_crc(version == 1 ? 1 : 2, bytes.data(), payload_size) != crc) {
    throw DataError("checkpoint " + name + ": corrupt: the CRC-32 of the contents does not match");
  }
  if (version != 1 && version != kCheckpointFormatVersion) {
    throw DataError("checkpoint " + name + ": format version " + std::to_string(version) +
                    ", written by a newer dptrain; this one reads versions 1 to " +
                    std::to_string(kCheckpointFormatVersion));
  }

  ByteReader r(payload, payload_size, name);
  Checkpoint c;
  c.format_version = version;
  c.config.width = r.i64();
  c.config.num_classes = r.i64();
  c.config.in_channels = r.i64();
  c.config.batch_size = r.i64();
  c.config.lr = r.f64();
  c.config.seed = r.u64();
  c.config.train_size = r.i64();
  c.config.world_size = r.i64();
  if (version >= 2) c.config.train_digest = r.text(kMaxDigest, "training-set digest");
  c.epochs_done = r.i64();
  c.step_in_epoch = r.i64();
  c.global_step = r.i64();
  c.partial_sums.loss_sum = r.f64();
  c.partial_sums.correct = r.f64();
  c.partial_sums.count = r.f64();
  c.partial_seconds = r.f64();
  if (c.config.width <= 0 || c.config.num_classes <= 0 || c.config.in_channels <= 0 ||
      c.epochs_done < 0 || c.step_in_epoch < 0 || c.global_step < 0) {
    r.fail("negative or zero setting");
  }
  const uint64_t epochs = r.u64();
  if (epochs > kMaxEpochs) r.fail("history of " + std::to_string(epochs) + " epochs");
  for (uint64_t i = 0; i < epochs; ++i) c.history.push_back(read_stats(r));
  const uint64_t count = r.u64();
  if (count > kMaxTensors) r.fail(std::to_string(count) + " tensors");
  for (uint64_t i = 0; i < count; ++i) c.tensors.push_back(read_tensor(r));
  if (r.remaining() != 0) r.fail(std::to_string(r.remaining()) + " stray bytes after the tensors");
  return c;
}

// ---- Files -------------------------------------------------------------------------------

void write_checkpoint_atomically(const Checkpoint& checkpoint, const std::string& path) {
  const auto bytes = serialize_checkpoint(checkpoint);
  write_file_atomically(path, bytes.data(), bytes.size(), "checkpoint " + path,
                        " (the previous checkpoints are untouched)");
}

Checkpoint read_checkpoint(const std::string& path) {
  return parse_checkpoint(read_regular_file(path, "checkpoint"), path);
}

void check_checkpoint_matches(const CheckpointConfig& saved, const CheckpointConfig& run,
                              const std::string& name) {
  std::string differences;
  const auto compare = [&](const char* flag, int64_t was, int64_t is) {
    if (was == is) return;
    differences += std::string(differences.empty() ? "" : ", ") + flag + " " + std::to_string(was) +
                   " (this run: " + std::to_string(is) + ")";
  };
  compare("--width", saved.width, run.width);
  compare("classes", saved.num_classes, run.num_classes);
  compare("input channels", saved.in_channels, run.in_channels);
  if (!differences.empty()) {
    throw UsageError("checkpoint " + name + " was written for another model: " + differences);
  }
}

std::vector<std::pair<std::string, torch::Tensor>> model_tensors(const torch::nn::Module& model) {
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  for (const auto& item : model.named_parameters()) {
    tensors.emplace_back(item.key(), item.value().detach().to(torch::kCPU).contiguous().clone());
  }
  for (const auto& item : model.named_buffers()) {
    tensors.emplace_back(item.key(), item.value().detach().to(torch::kCPU).contiguous().clone());
  }
  return tensors;
}

void load_model_tensors(torch::nn::Module& model,
                        const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                        const std::string& name) {
  torch::NoGradGuard no_grad;
  std::map<std::string, const torch::Tensor*> by_name;
  for (const auto& [key, tensor] : tensors) by_name[key] = &tensor;
  const auto load = [&](const std::string& key, torch::Tensor& target) {
    const auto found = by_name.find(key);
    if (found == by_name.end()) {
      throw DataError("checkpoint " + name + ": has no tensor '" + key + "'");
    }
    const auto& source = *found->second;
    if (source.sizes() != target.sizes() || source.scalar_type() != target.scalar_type()) {
      std::ostringstream what;
      what << "checkpoint " << name << ": tensor '" << key << "' is " << source.scalar_type()
           << source.sizes() << ", the model's is " << target.scalar_type() << target.sizes();
      throw DataError(what.str());
    }
    target.copy_(source);
  };
  size_t loaded = 0;
  for (auto& item : model.named_parameters()) {
    load(item.key(), item.value());
    ++loaded;
  }
  for (auto& item : model.named_buffers()) {
    load(item.key(), item.value());
    ++loaded;
  }
  if (by_name.size() != tensors.size()) {
    throw DataError("checkpoint " + name + ": a tensor name appears twice");
  }
  if (loaded != tensors.size()) {
    throw DataError("checkpoint " + name + ": holds " + std::to_string(tensors.size()) +
                    " tensors, the model " + std::to_string(loaded));
  }
}

}  // namespace dptrain
