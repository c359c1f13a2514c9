// dptrain's own checkpoint format of versions 1 and 2 (DPTRNCKP), which dptrain wrote before its
// checkpoints became safetensors files (version 3, checkpoint.cpp): still read, so that a run
// can resume from them, and never written (tests/fixtures/checkpoints holds such files for the
// reader's tests). Not here: the checks of a checkpoint's contents, which every version shares
// (checkpoint_run_state.h).
//
// File layout, little-endian:
//   8 bytes  magic "DPTRNCKP"
//   u32      format version (1 or 2)
//   u64      payload size in bytes
//   u32      CRC-32 (zlib's) of the magic, version and size, then the payload (version 1: of the
//            payload alone)
//   payload: the configuration (with the training set's digest from version 2 on), the
//            position, the epoch history, then the named tensors
//            (name, dtype code, rank, dims, raw bytes in row-major order).
#include "checkpoint_legacy.h"
#include "checkpoint_run_state.h"

#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <new>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dptrain/core/errors.h"
#include "dptrain/core/files.h"
#include "dptrain/data/data.h"
#include "dptrain/model/model.h"
#include "dptrain/train/accepted_model.h"
#include "dptrain/train/checkpoint_types.h"
#include "dptrain/train/epoch_stats.h"

namespace dptrain {
namespace {

constexpr char kMagic[8] = {'D', 'P', 'T', 'R', 'N', 'C', 'K', 'P'};
constexpr size_t kHeaderBytes = 8 + 4 + 8 + 4;
constexpr uint64_t kMaxTensors = 100000;  // far above any model dptrain builds
constexpr uint64_t kMaxRank = 8;
constexpr uint64_t kMaxName = 4096;
constexpr uint64_t kMaxEpochs = 1000000;
constexpr uint64_t kMaxDigest = 128;  // a hex SHA-256 is 64
constexpr size_t kConfigBytes = 8 * 8;  // width .. world_size, before the digest
constexpr size_t kStatsBytes = 9 * 8;   // one epoch of history
// A zip archive's first bytes: TorchScript and torch::save files, which dptrain never opens.
constexpr uint8_t kZipMagic[4] = {'P', 'K', 3, 4};

// ---- Little-endian reading -----------------------------------------------------------------

// Every read is bounds-checked; running off the end is a DataError naming the file.
class ByteReader {
 public:
  // `label` starts every message: "checkpoint PATH" or "--model PATH".
  ByteReader(const uint8_t* data, size_t size, const std::string& label)
      : data_(data), size_(size), label_(label) {}
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
    throw DataError(label_ + ": corrupt: " + what + " at byte " + std::to_string(offset_));
  }

 private:
  void need(uint64_t n) const {
    if (n > size_ - offset_) {
      throw DataError(label_ + ": truncated: needs " + std::to_string(n) +
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
  const std::string& label_;
};

// The dtypes a model of ours holds; the codes are part of the file format.
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
  const std::string shown = printable(name);  // a name is the file's bytes: escape them
  const auto dtype = dtype_of_code(r.u32());
  if (!dtype) r.fail("unknown dtype code in tensor " + shown);
  const uint64_t rank = r.u64();
  if (rank > kMaxRank) r.fail("tensor " + shown + " of rank " + std::to_string(rank));
  std::vector<int64_t> dims;
  uint64_t numel = 1;
  for (uint64_t d = 0; d < rank; ++d) {
    const int64_t size = r.i64();
    if (size < 0 ||
        (size > 0 && numel > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(size))) {
      r.fail("tensor " + shown + " with bad dimension " + std::to_string(size));
    }
    numel *= static_cast<uint64_t>(size);
    dims.push_back(size);
  }
  const uint64_t element = c10::elementSize(*dtype);
  const uint64_t stored = r.u64();
  if (numel > r.remaining() / element || stored != numel * element) {
    r.fail("tensor " + shown + " holds " + std::to_string(stored) + " bytes, its shape " +
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


// The most bytes a DPTRNCKP file of this model and history can take, names at their longest.
uint64_t legacy_size_limit(int64_t width, int64_t num_classes, int64_t in_channels,
                               int64_t epochs_done) {
  // At 8 bytes an element (float64 is the widest dtype a file may hold).
  const auto e = static_cast<uint64_t>(std::clamp<int64_t>(epochs_done, 0, kMaxEpochs));
  const uint64_t elements = model_elements_bound(width, num_classes, in_channels);
  // Per tensor: its name (at most kMaxName bytes), dtype, rank, dims and byte count; a model
  // holds about 120 tensors.
  const uint64_t per_tensor = 8 + kMaxName + 4 + 8 + 8 * kMaxRank + 8;
  return kConfigBytes + 8 + kMaxDigest + 7 * 8 + 8 + e * kStatsBytes + 8 + 1000 * per_tensor +
         8 * elements;
}


}  // namespace

bool is_legacy_checkpoint(const uint8_t* first, size_t available) {
  return (available >= sizeof kZipMagic && std::memcmp(first, kZipMagic, sizeof kZipMagic) == 0) ||
         (available >= sizeof kMagic && std::memcmp(first, kMagic, sizeof kMagic) == 0);
}

namespace {
// The configuration and position at the payload's start, parsed; then the rest.
Checkpoint parse_payload(const uint8_t* payload, size_t payload_size, uint32_t version,
                         const std::string& label) {
  ByteReader r(payload, payload_size, label);
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
  const uint64_t epochs = r.u64();
  if (epochs > kMaxEpochs) r.fail("history of " + std::to_string(epochs) + " epochs");
  if (epochs > r.remaining() / kStatsBytes) r.fail("history of " + std::to_string(epochs) + " epochs");
  for (uint64_t i = 0; i < epochs; ++i) c.history.push_back(read_stats(r));
  check_checkpoint_contents(c, label);
  const uint64_t count = r.u64();
  if (count > kMaxTensors) r.fail(std::to_string(count) + " tensors");
  for (uint64_t i = 0; i < count; ++i) c.tensors.push_back(read_tensor(r));
  if (r.remaining() != 0) r.fail(std::to_string(r.remaining()) + " stray bytes after the tensors");
  check_checkpoint_tensors(c.tensors, label);
  return c;
}

// The header's fields, checked against the file's size: a file is refused by what its first
// bytes say before the rest is read. `size` is the whole file's.
struct Header {
  uint32_t version = 0;
  uint64_t payload_size = 0;
  uint32_t crc = 0;
};
Header parse_header(const uint8_t* bytes, size_t available, uint64_t size,
                    const std::string& label) {
  if (available >= sizeof kZipMagic && std::memcmp(bytes, kZipMagic, sizeof kZipMagic) == 0) {
    throw DataError(label +
                    ": a zip archive (TorchScript or torch.save; --save-model wrote these "
                    "before it wrote checkpoints), not a dptrain checkpoint; dptrain never opens "
                    "archives, because loading one runs the code it may carry");
  }
  if (available < sizeof kMagic || std::memcmp(bytes, kMagic, sizeof kMagic) != 0) {
    throw DataError(label + ": not a dptrain checkpoint (no DPTRNCKP header)");
  }
  ByteReader header(bytes, available, label);
  header.raw(sizeof kMagic);
  Header h;
  h.version = header.u32();
  h.payload_size = header.u64();
  h.crc = header.u32();
  if (h.payload_size != size - kHeaderBytes) {
    throw DataError(label + ": truncated or padded: the header promises " +
                    std::to_string(h.payload_size) + " bytes of payload, the file has " +
                    std::to_string(size - kHeaderBytes));
  }
  // zlib takes the length as uInt; a checkpoint of ours is far below 4 GiB, but check anyway.
  if (h.payload_size > std::numeric_limits<uInt>::max()) {
    throw DataError(label + ": payload of " + std::to_string(h.payload_size) +
                    " bytes is larger than dptrain writes");
  }
  return h;
}

}  // namespace

Checkpoint parse_legacy_checkpoint(const uint8_t* bytes, size_t size, const std::string& label) {
  const Header h = parse_header(bytes, size, size, label);
  // The CRC first: only a header that is intact may claim a version this dptrain does not know.
  // Later versions keep version 2's CRC, which covers the version field.
  if (file_crc(h.version == 1 ? 1 : 2, bytes, h.payload_size) != h.crc) {
    throw DataError(label + ": corrupt: the CRC-32 of the contents does not match");
  }
  if (h.version == 0) {
    throw DataError(label + ": format version 0, which no dptrain writes (corrupt or foreign)");
  }
  if (h.version != 1 && h.version != 2) {
    throw DataError(label + ": format version " + std::to_string(h.version) +
                    " in a DPTRNCKP header, which no dptrain writes (from version 3 on, "
                    "checkpoints are safetensors files)");
  }
  return parse_payload(bytes + kHeaderBytes, h.payload_size, h.version, label);
}

Checkpoint read_legacy_checkpoint(const RegularFile& file, const AcceptedModel& accepted) {
  const std::string label = file.name();
  // The header and the configuration first, read where they stand; the file is read whole only
  // when the run accepts the model it claims and its size is one such a checkpoint can have.
  uint8_t head[kHeaderBytes + kConfigBytes] = {};
  const auto head_size = static_cast<size_t>(std::min<uint64_t>(file.size(), sizeof head));
  file.read_at(0, head, head_size);
  parse_header(head, head_size, file.size(), label);
  if (head_size == sizeof head) {
    ByteReader config(head + kHeaderBytes, kConfigBytes, label);
    const int64_t width = config.i64();
    const int64_t classes = config.i64();
    const int64_t channels = config.i64();
    accepted_width(width, accepted, label);
    if (accepted.model_tensors && (classes != kNumClasses || channels != 1)) {
      throw DataError(label + " was written for another model: " + std::to_string(classes) +
                      " classes, " + std::to_string(channels) + " input channel(s) (this " +
                      "dptrain builds " + std::to_string(kNumClasses) + " and 1); not read");
    }
    // The history's length lies beyond the digest; the bound takes the longest one. A damaged
    // width only loosens the bound up to what the run accepts: the CRC finds the damage once the
    // file is read.
    const uint64_t limit = legacy_size_limit(width, classes, channels, kMaxEpochs);
    if (file.size() > limit) {
      throw DataError(label + ": " + std::to_string(file.size()) +
                      " bytes, more than a checkpoint of a width-" + std::to_string(width) +
                      " model can hold (at most " + std::to_string(limit) + "); not read");
    }
  }
  std::vector<uint8_t> bytes;
  try {
    bytes.resize(static_cast<size_t>(file.size()));
  } catch (const std::bad_alloc&) {
    throw DataError(label + ": out of memory for its " + std::to_string(file.size()) +
                    " bytes while reading it; free memory, or raise the process's limit " +
                    "(ulimit -v), and run again");
  }
  file.read_at(0, bytes.data(), bytes.size());
  return parse_legacy_checkpoint(bytes.data(), bytes.size(), label);
}

}  // namespace dptrain
