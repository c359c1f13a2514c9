// Tests of the checkpoint file format (checkpoint.h): exact round trips, a strict reader that
// turns every foreign, truncated, corrupt or newer file into a DataError (never a crash), an
// atomic writer that keeps the older checkpoint when a write fails, and the directory helpers.
// Not here: when training writes checkpoints and how it resumes (test_resume.cpp).
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <torch/serialize.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "dptrain/core/errors.h"
#include "dptrain/core/files.h"
#include "dptrain/core/safetensors.h"
#include "dptrain/core/sha256.h"
#include "dptrain/data/data.h"
#include "dptrain/model/model.h"
#include "dptrain/train/checkpoint.h"
#include "dptrain/train/checkpoint_directory.h"
#include "dptrain/train/checkpoint_types.h"
#include "dptrain/train/options.h"
#include "dptrain/train/recipe.h"
#include "support/test_support.h"
#include "support/train_support.h"

namespace {

using namespace dptrain;
using namespace dptrain::testing;

// ---- Helpers ------------------------------------------------------------------------------

EpochStats stats_for_epoch(int64_t epoch) {
  EpochStats s;
  s.epoch = epoch;
  s.epochs = 7;
  s.train_loss = 2.302585092994046 / static_cast<double>(epoch);
  s.train_acc = 0.1 * static_cast<double>(epoch) + 1e-17;
  s.test_loss = -0.0;  // the sign bit must survive too
  s.test_acc = std::nextafter(0.5, 1.0);
  s.seconds = 1e-300;
  s.images_per_second = 6.02214076e11;  // in range (at most 10^12), and no round number
  s.steps = 2 + epoch;                  // fits the smallest epoch here (8 steps)
  return s;
}

// A checkpoint in which every field holds a value that no default or neighbour shares.
Checkpoint sample_checkpoint() {
  Checkpoint c;
  c.config.width = 8;
  c.config.num_classes = 10;
  c.config.in_channels = 1;
  c.config.batch_size = 96;
  c.config.lr = 0.1;                      // not exact in binary: the bits must round-trip anyway
  c.config.seed = 0xFEDCBA9876543210ull;  // above INT64_MAX
  c.config.train_size = 60000;
  c.config.world_size = 3;
  c.config.train_digest = "5f0c" + std::string(60, 'a');
  c.epochs_done = 2;
  c.step_in_epoch = 17;
  c.global_step = 2 * 625 + 17;
  c.partial_sums = {37.25, 15, 1632};
  c.partial_seconds = 12.375;
  c.history = {stats_for_epoch(1), stats_for_epoch(2)};
  torch::manual_seed(5);
  c.tensors.emplace_back("conv.weight", torch::randn({3, 1, 2, 2}));
  c.tensors.emplace_back("bn.num_batches_tracked",
                         torch::tensor(int64_t{0x0123456789ABCDEF}, torch::kInt64));
  c.tensors.emplace_back("double", torch::randn({5}, torch::kFloat64));
  c.tensors.emplace_back("bf16", torch::randn({2, 3}).to(torch::kBFloat16));
  c.tensors.emplace_back("f16", torch::randn({4}).to(torch::kFloat16));
  c.tensors.emplace_back("empty", torch::zeros({0, 3}));
  // Not contiguous: the writer stores it in row-major order of its logical shape.
  c.tensors.emplace_back("transposed", torch::arange(6, torch::kFloat32).reshape({2, 3}).t());
  return c;
}

// A checkpoint a few hundred bytes long, for the loops over every byte.
Checkpoint small_checkpoint() {
  Checkpoint c;
  c.config = CheckpointConfig{4, 10, 1, 32, 0.05, 7, 256, 2, std::string(64, 'd'), Recipe{}, 0};
  c.epochs_done = 1;
  c.step_in_epoch = 3;
  c.global_step = 11;
  c.partial_sums = {6.5, 40, 96};
  c.partial_seconds = 0.25;
  c.history = {stats_for_epoch(1)};
  c.tensors.emplace_back("w", torch::tensor({1.5f, -2.0f, 3.25f}));
  c.tensors.emplace_back("n", torch::tensor(int64_t{42}, torch::kInt64));
  return c;
}

// A version 3 file's header (the JSON after the 8-byte length) and the file rebuilt around an
// edited one, its data kept: for the tests that change what a header says.
std::string header_of(const std::vector<uint8_t>& file) {
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t{file[i]} << (8 * i);
  return std::string(file.begin() + 8, file.begin() + 8 + static_cast<long>(n));
}
std::vector<uint8_t> with_header(const std::vector<uint8_t>& file, std::string header) {
  const size_t data_at = 8 + header_of(file).size();
  while (header.size() % 8 != 0) header += ' ';
  std::vector<uint8_t> rebuilt(8);
  for (int i = 0; i < 8; ++i) rebuilt[i] = static_cast<uint8_t>(header.size() >> (8 * i));
  rebuilt.insert(rebuilt.end(), header.begin(), header.end());
  rebuilt.insert(rebuilt.end(), file.begin() + static_cast<long>(data_at), file.end());
  return rebuilt;
}
// `file` with the digest its content now has, as if dptrain had written it.
std::vector<uint8_t> redigested(const std::vector<uint8_t>& file) {
  const auto header = parse_safetensors(file, "edited").first;
  const std::string old_digest = header.metadata.at("dptrain.digest");
  const std::string new_digest =
      checkpoint_content_digest(header, file.data() + header.data_offset());
  std::string text = header_of(file);
  text.replace(text.find(old_digest), old_digest.size(), new_digest);
  return with_header(file, text);
}
std::string replaced(std::string text, const std::string& from, const std::string& to) {
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from << " not in " << text;
  if (at != std::string::npos) text.replace(at, from.size(), to);
  return text;
}

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// Every field bit for bit, the tensors by name, dtype, shape and raw bytes.
void expect_same_checkpoint(const Checkpoint& a, const Checkpoint& b) {
  EXPECT_EQ(a.config.width, b.config.width);
  EXPECT_EQ(a.config.num_classes, b.config.num_classes);
  EXPECT_EQ(a.config.in_channels, b.config.in_channels);
  EXPECT_EQ(a.config.batch_size, b.config.batch_size);
  EXPECT_TRUE(same_bits(a.config.lr, b.config.lr));
  EXPECT_EQ(a.config.seed, b.config.seed);
  EXPECT_EQ(a.config.train_size, b.config.train_size);
  EXPECT_EQ(a.config.world_size, b.config.world_size);
  EXPECT_EQ(a.config.train_digest, b.config.train_digest);
  EXPECT_EQ(a.format_version, b.format_version);
  EXPECT_EQ(a.epochs_done, b.epochs_done);
  EXPECT_EQ(a.step_in_epoch, b.step_in_epoch);
  EXPECT_EQ(a.global_step, b.global_step);
  for (const auto field : {&Totals::loss_sum, &Totals::correct, &Totals::count}) {
    EXPECT_TRUE(same_bits(a.partial_sums.*field, b.partial_sums.*field)) << "a partial sum";
  }
  EXPECT_TRUE(same_bits(a.partial_seconds, b.partial_seconds));
  ASSERT_EQ(a.history.size(), b.history.size());
  for (size_t i = 0; i < a.history.size(); ++i) {
    SCOPED_TRACE("history entry " + std::to_string(i));
    const auto &x = a.history[i], &y = b.history[i];
    EXPECT_EQ(x.epoch, y.epoch);
    EXPECT_EQ(x.epochs, y.epochs);
    EXPECT_TRUE(same_bits(x.train_loss, y.train_loss));
    EXPECT_TRUE(same_bits(x.train_acc, y.train_acc));
    EXPECT_TRUE(same_bits(x.test_loss, y.test_loss));
    EXPECT_TRUE(same_bits(x.test_acc, y.test_acc));
    EXPECT_TRUE(same_bits(x.seconds, y.seconds));
    EXPECT_TRUE(same_bits(x.images_per_second, y.images_per_second));
    EXPECT_EQ(x.steps, y.steps);
  }
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    const auto& [name, t] = a.tensors[i];
    const auto& [other_name, u] = b.tensors[i];
    SCOPED_TRACE("tensor " + name);
    EXPECT_EQ(name, other_name);
    ASSERT_EQ(t.scalar_type(), u.scalar_type());
    ASSERT_EQ(t.sizes(), u.sizes());
    const auto tc = t.contiguous(), uc = u.contiguous();
    if (tc.numel() > 0) {
      EXPECT_EQ(std::memcmp(tc.data_ptr(), uc.data_ptr(), tc.numel() * tc.element_size()), 0);
    }
  }
}

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// ---- dptrain's older files (DPTRNCKP, versions 1 and 2) -------------------------------------

// Files of format versions 1 and 2 as the last dptrain that wrote them wrote them
// (tests/fixtures/checkpoints/README.md says what each holds): small-v2.dpt is small_checkpoint
// in version 2, small-v1.dpt the same in version 1, without a training set's digest.
std::string legacy_fixture_path(const std::string& name) {
  return std::string(DPTRAIN_TEST_DATA_DIR) + "/checkpoints/" + name;
}
std::vector<uint8_t> legacy_fixture(const std::string& name) {
  auto bytes = read_bytes(legacy_fixture_path(name));
  EXPECT_GT(bytes.size(), 24u) << legacy_fixture_path(name);
  return bytes;
}
Checkpoint small_checkpoint_in_version(uint32_t version) {
  auto c = small_checkpoint();
  c.format_version = version;
  if (version == 1) c.config.train_digest.clear();
  return c;
}

// Where small-v2.dpt's fields lie in its payload, after the 24-byte header: 8 config fields, the
// digest (its length, then its 64 characters), 3 position fields, 3 sums, seconds, the history's
// count, its one epoch (9 fields of 8 bytes), the tensor count, then the tensors, "w" first.
constexpr size_t kLegacyHeaderBytes = 24;
constexpr size_t kDigestAt = 8 * 8;
constexpr size_t kPosition = kDigestAt + 8 + 64;  // epochs done, step, global step
constexpr size_t kSums = kPosition + 3 * 8;         // loss sum, correct, count
constexpr size_t kSeconds = kSums + 3 * 8;
constexpr size_t kHistoryCount = kPosition + 7 * 8;
constexpr size_t kHistory = kHistoryCount + 8;  // epoch, epochs, train loss, train acc, test
                                                 // loss, test acc, seconds, img/s, steps
constexpr size_t kTensorCount = kHistory + 9 * 8;
constexpr size_t kFirstNameSize = kTensorCount + 8;
// The first tensor "w": name (8 + 1 bytes), dtype code, rank, one dimension, byte count, data.
constexpr size_t kFirstDtype = kFirstNameSize + 8 + 1;
constexpr size_t kFirstRank = kFirstDtype + 4;
constexpr size_t kFirstDim = kFirstRank + 8;
constexpr size_t kFirstStored = kFirstDim + 8;
constexpr size_t kFirstData = kFirstStored + 8;  // 3 float32

void put_u64(std::vector<uint8_t>& bytes, size_t at, uint64_t v) {
  for (int i = 0; i < 8; ++i) bytes[at + i] = static_cast<uint8_t>(v >> (8 * i));
}
void put_f64(std::vector<uint8_t>& bytes, size_t at, double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, 8);
  put_u64(bytes, at, bits);
}
void put_f32(std::vector<uint8_t>& bytes, size_t at, float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  for (int i = 0; i < 4; ++i) bytes[at + i] = static_cast<uint8_t>(bits >> (8 * i));
}

// The CRC-32 a version-2 header carries: over the 20 header bytes before it, then the payload.
void fix_crc(std::vector<uint8_t>& file) {
  uLong crc = ::crc32(0L, Z_NULL, 0);
  crc = ::crc32(crc, file.data(), 20);
  crc = ::crc32(crc, file.data() + 24, static_cast<uInt>(file.size() - 24));
  for (int i = 0; i < 4; ++i) file[20 + i] = static_cast<uint8_t>(crc >> (8 * i));
}

// `payload` under small-v2.dpt's header, the header's payload size and CRC refitted: the file a
// writer of that payload wrote.
std::vector<uint8_t> legacy_with_payload(const std::vector<uint8_t>& payload) {
  auto file = legacy_fixture("small-v2.dpt");
  file.resize(kLegacyHeaderBytes);
  put_u64(file, 12, payload.size());
  file.insert(file.end(), payload.begin(), payload.end());
  fix_crc(file);
  return file;
}
// small-v2.dpt with `edit` made to its payload, its CRC refitted.
std::vector<uint8_t> legacy_edited(const std::function<void(std::vector<uint8_t>&)>& edit) {
  const auto original = legacy_fixture("small-v2.dpt");
  std::vector<uint8_t> payload(original.begin() + kLegacyHeaderBytes, original.end());
  edit(payload);
  return legacy_with_payload(payload);
}
// An edit made to small_checkpoint and the same edit made to small-v2.dpt's payload: the
// version 3 file written from the one and the version 2 file made by the other, for the tests
// that every version's reader refuses the same contents.
using PayloadEdit = std::function<void(std::vector<uint8_t>&)>;
std::vector<std::pair<uint32_t, std::vector<uint8_t>>> edited_in_both_versions(
    const std::function<void(Checkpoint&)>& edit, const PayloadEdit& payload_edit) {
  auto c = small_checkpoint();
  edit(c);
  return {{kCheckpointFormatVersion, serialize_checkpoint(c)}, {2u, legacy_edited(payload_edit)}};
}

// The training set's digest replaced by `digest` (its length and its bytes).
void put_digest(std::vector<uint8_t>& payload, const std::string& digest) {
  std::vector<uint8_t> field(8);
  put_u64(field, 0, digest.size());
  field.insert(field.end(), digest.begin(), digest.end());
  payload.erase(payload.begin() + kDigestAt, payload.begin() + kPosition);
  payload.insert(payload.begin() + kDigestAt, field.begin(), field.end());
}

// Holds a soft RLIMIT_FSIZE of `bytes` for this process, with SIGXFSZ ignored, so that writing
// past it fails with EFBIG; restores both on destruction.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    getrlimit(RLIMIT_FSIZE, &saved_);
    old_handler_ = signal(SIGXFSZ, SIG_IGN);
    rlimit limit = saved_;
    limit.rlim_cur = bytes;
    ok_ = setrlimit(RLIMIT_FSIZE, &limit) == 0;
  }
  ~FileSizeLimit() {
    setrlimit(RLIMIT_FSIZE, &saved_);
    signal(SIGXFSZ, old_handler_);
  }
  bool ok() const { return ok_; }

 private:
  rlimit saved_{};
  sighandler_t old_handler_ = SIG_DFL;
  bool ok_ = false;
};

// ---- Round trip -------------------------------------------------------------------------

TEST(CheckpointFormat, RoundTripIsExact) {
  const auto original = sample_checkpoint();
  const auto bytes = serialize_checkpoint(original);
  const auto parsed = parse_checkpoint(bytes, "memory");
  expect_same_checkpoint(original, parsed);
  // The transposed tensor was stored by its logical order, not its storage order.
  const auto& transposed = parsed.tensors.back().second;
  EXPECT_TRUE(torch::equal(transposed, torch::tensor({{0.f, 3.f}, {1.f, 4.f}, {2.f, 5.f}})));
  // Serialising the parsed checkpoint gives the same bytes again.
  EXPECT_EQ(serialize_checkpoint(parsed), bytes);
}

// A run that diverges writes losses of NaN and +inf (the test loss of weights grown huge); its
// checkpoints were refused by the contents check at first, and must stay readable.
TEST(CheckpointFormat, NanAndInfiniteLossesOfADivergedRunAreRead) {
  auto original = sample_checkpoint();
  ASSERT_FALSE(original.history.empty());
  original.history.back().train_loss = std::numeric_limits<double>::infinity();
  original.history.back().test_loss = -std::numeric_limits<double>::quiet_NaN();
  original.partial_sums.loss_sum = std::numeric_limits<double>::infinity();
  const auto bytes = serialize_checkpoint(original);
  const auto parsed = parse_checkpoint(bytes, "memory");
  EXPECT_TRUE(std::isinf(parsed.history.back().train_loss));
  EXPECT_TRUE(std::isnan(parsed.history.back().test_loss));
  EXPECT_TRUE(std::isinf(parsed.partial_sums.loss_sum));
  EXPECT_EQ(serialize_checkpoint(parsed), bytes);
}

// A version 3 file is a safetensors file: an 8-byte length, a JSON header whose metadata holds
// the run, the data 8-byte aligned.
TEST(CheckpointFormat, FileIsSafetensorsWithTheRunInItsMetadata) {
  const auto c = small_checkpoint();
  const auto bytes = serialize_checkpoint(c);
  const auto [header, tensors] = parse_safetensors(bytes, "small");
  EXPECT_EQ(header.data_offset() % 8, 0u);
  EXPECT_EQ(header.metadata.at("dptrain.format_version"), "3");
  EXPECT_EQ(header.metadata.at("dptrain.kind"), "checkpoint");
  EXPECT_EQ(header.metadata.at("dptrain.width"), "4");
  EXPECT_EQ(header.metadata.at("dptrain.epochs_done"), "1");
  EXPECT_EQ(header.metadata.at("format"), "pt");
  EXPECT_EQ(header.metadata.at("dptrain.digest").rfind("sha256:", 0), 0u);
  EXPECT_EQ(header.metadata.at("dptrain.digest").size(), 7u + 64u);
  EXPECT_NE(header.metadata.at("dptrain.run_state").find("\"global_step\":11"), std::string::npos);
  ASSERT_EQ(tensors.size(), 2u);
  EXPECT_EQ(tensors[0].first, "w");
  EXPECT_TRUE(torch::equal(tensors[0].second, c.tensors[0].second));
  EXPECT_EQ(tensors[1].first, "n");
  // A model file says so.
  auto model = c;
  model.kind = CheckpointKind::kModel;
  const auto model_bytes = serialize_checkpoint(model);
  EXPECT_EQ(parse_safetensors(model_bytes, "m").first.metadata.at("dptrain.kind"), "model");
  EXPECT_EQ(parse_checkpoint(model_bytes, "m").kind, CheckpointKind::kModel);
}

TEST(CheckpointFormat, LegacyHeaderLayoutIsAsDocumented) {
  const auto bytes = legacy_fixture("small-v2.dpt");
  ASSERT_GE(bytes.size(), 24u);
  EXPECT_EQ(std::string(bytes.begin(), bytes.begin() + 8), "DPTRNCKP");
  uint32_t version = 0;
  uint64_t payload = 0;
  for (int i = 0; i < 4; ++i) version |= uint32_t{bytes[8 + i]} << (8 * i);
  for (int i = 0; i < 8; ++i) payload |= uint64_t{bytes[12 + i]} << (8 * i);
  EXPECT_EQ(version, 2u);
  EXPECT_EQ(payload, bytes.size() - 24);
}

TEST(CheckpointFormat, FileRoundTripIsExact) {
  TempDir dir;
  const auto original = sample_checkpoint();
  const std::string path = dir.file(checkpoint_file_name(2, 17));
  write_checkpoint_atomically(original, path);
  EXPECT_EQ(temporary_files_in(parent_directory(path)), std::vector<std::string>{});
  expect_same_checkpoint(original, read_checkpoint(path));
}

TEST(CheckpointFormat, FileNamesSortByPosition) {
  EXPECT_EQ(checkpoint_file_name(3, 0), "checkpoint-e0003-s000000.safetensors");
  EXPECT_EQ(checkpoint_file_name(0, 12), "checkpoint-e0000-s000012.safetensors");
  EXPECT_EQ(checkpoint_file_name(12345, 1234567), "checkpoint-e12345-s1234567.safetensors");
  // Older runs' .dpt files sort among the new ones by position, before a new one of theirs.
  EXPECT_TRUE(named_before("checkpoint-e0003-s000000.dpt", checkpoint_file_name(3, 0)));
  EXPECT_FALSE(named_before(checkpoint_file_name(3, 0), "checkpoint-e0003-s000000.dpt"));
  EXPECT_TRUE(named_before(checkpoint_file_name(2, 5), "checkpoint-e0003-s000000.dpt"));
  EXPECT_TRUE(named_before("checkpoint-e0003-s000000.dpt", checkpoint_file_name(3, 1)));
  EXPECT_TRUE(named_before(checkpoint_file_name(9999, 0), checkpoint_file_name(10000, 0)));
}

// ---- Foreign, truncated, corrupt, newer ----------------------------------------------------

TEST(CheckpointFormat, ForeignFilesAreNotCheckpoints) {
  TempDir dir;
  // A torch::save archive (a zip), as PyTorch or an older dptrain's --save-model writes: opening
  // one would run the code it carries, so it is named and refused.
  const std::string zip = dir.file("model.pt");
  torch::save(torch::ones({4}), zip);
  ASSERT_GT(file_size(zip), 0);
  expect_data_error([&] { read_checkpoint(zip, "--model"); },
                    {"--model " + zip + ": a zip archive", "not a dptrain checkpoint",
                     "never opens archives"});

  std::mt19937 random(11);
  std::vector<uint8_t> noise(1000);
  for (auto& b : noise) b = static_cast<uint8_t>(random());
  write_bytes(dir.file("noise"), noise);
  expect_data_error([&] { read_checkpoint(dir.file("noise")); },
                    {dir.file("noise"), "not a dptrain checkpoint"});

  write_bytes(dir.file("empty"), {});
  expect_data_error([&] { read_checkpoint(dir.file("empty")); },
                    {dir.file("empty"), "not a dptrain checkpoint"});

  // The magic alone, or almost.
  write_bytes(dir.file("magic"), {'D', 'P', 'T', 'R', 'N', 'C', 'K'});
  expect_data_error([&] { read_checkpoint(dir.file("magic")); }, {"not a dptrain checkpoint"});
}

TEST(CheckpointFormat, MissingFileAndDirectoryAreDataErrors) {
  TempDir dir;
  expect_data_error([&] { read_checkpoint(dir.file("absent.dpt")); },
                    {dir.file("absent.dpt"), "cannot open"});
  expect_data_error([&] { read_checkpoint(dir.path()); }, {dir.path(), "not a regular file"});
}

TEST(CheckpointFormat, EveryTruncationIsADataError) {
  const auto bytes = serialize_checkpoint(small_checkpoint());
  ASSERT_LT(bytes.size(), 2000u);  // keeps the loop short
  for (size_t length = 0; length < bytes.size(); ++length) {
    SCOPED_TRACE("first " + std::to_string(length) + " of " + std::to_string(bytes.size()) +
                 " bytes");
    const std::vector<uint8_t> prefix(bytes.begin(), bytes.begin() + length);
    expect_data_error([&] { parse_checkpoint(prefix, "cut.dpt"); }, {"cut.dpt"});
  }
  // And one byte too many.
  auto padded = bytes;
  padded.push_back(0);
  expect_data_error([&] { parse_checkpoint(padded, "padded.dpt"); }, {"padded.dpt", "padded"});
}

TEST(CheckpointFormat, EverySingleByteChangeIsADataError) {
  const auto bytes = serialize_checkpoint(small_checkpoint());
  for (size_t i = 0; i < bytes.size(); ++i) {
    for (uint8_t mask : {uint8_t{0x01}, uint8_t{0x80}, uint8_t{0xFF}}) {
      SCOPED_TRACE("byte " + std::to_string(i) + " ^ " + std::to_string(mask));
      auto changed = bytes;
      changed[i] ^= mask;
      expect_data_error([&] { parse_checkpoint(changed, "flipped.safetensors"); },
                        {"flipped.safetensors"});
    }
  }
  // In the data, the digest is what catches a change.
  auto changed = bytes;
  changed.back() ^= 0x01;
  expect_data_error([&] { parse_checkpoint(changed, "flipped.safetensors"); },
                    {"corrupt: the content digest does not match"});
}

TEST(CheckpointFormat, LegacyEverySingleByteChangeIsADataError) {
  const auto bytes = legacy_fixture("small-v2.dpt");
  for (size_t i = 0; i < bytes.size(); ++i) {
    for (uint8_t mask : {uint8_t{0x01}, uint8_t{0x80}, uint8_t{0xFF}}) {
      SCOPED_TRACE("byte " + std::to_string(i) + " ^ " + std::to_string(mask));
      auto changed = bytes;
      changed[i] ^= mask;
      // The payload starts after the 24-byte header: there the CRC must catch every change.
      std::vector<std::string> phrases{"flipped.dpt"};
      if (i >= 24) phrases.push_back("CRC");
      expect_data_error([&] { parse_checkpoint(changed, "flipped.dpt"); }, phrases);
    }
  }
}

// A file from a later dptrain: named as newer, not as corrupt; a version 3 the reader cannot
// parse as a number reads as corrupt; a safetensors file without dptrain's metadata is foreign.
TEST(CheckpointFormat, NewerFormatVersionIsNamed) {
  const auto bytes = serialize_checkpoint(small_checkpoint());
  const std::string header = header_of(bytes);
  const std::string three = "\"dptrain.format_version\":\"3\"";
  expect_data_error(
      [&] {
        parse_checkpoint(with_header(bytes, replaced(header, three, "\"dptrain.format_version\":\"4\"")),
                         "new.safetensors");
      },
      {"new.safetensors", "format version 4", "newer dptrain", "reads versions 1 to 3"});
  expect_data_error(
      [&] {
        parse_checkpoint(with_header(bytes, replaced(header, three, "\"dptrain.format_version\":\"3.0\"")),
                         "odd.safetensors");
      },
      {"odd.safetensors: corrupt: format version '3.0'"});
  expect_data_error(
      [&] {
        parse_checkpoint(with_header(bytes, replaced(header, three, "\"dptrain.formet_version\":\"3\"")),
                         "plain.safetensors");
      },
      {"plain.safetensors: a safetensors file without dptrain's run state, not a checkpoint"});
}

// A version-2 file from a later dptrain, intact (its CRC fits its header): named as newer.
TEST(CheckpointFormat, LegacyNewerFormatVersionIsNamed) {
  auto bytes = legacy_fixture("small-v2.dpt");
  bytes[8] = 3;
  fix_crc(bytes);
  expect_data_error([&] { parse_checkpoint(bytes, "new.dpt"); },
                    {"new.dpt", "format version 3 in a DPTRNCKP header, which no dptrain writes"});
  bytes[8] = 0;
  bytes[11] = 0x80;  // version 2^31
  fix_crc(bytes);
  expect_data_error([&] { parse_checkpoint(bytes, "new.dpt"); }, {"format version 2147483648"});
  // Version 0 is not newer: no dptrain writes it.
  bytes[11] = 0;
  fix_crc(bytes);
  expect_data_error([&] { parse_checkpoint(bytes, "zero.dpt"); },
                    {"zero.dpt: format version 0, which no dptrain writes"});
}

// One flipped bit in the version field (which would read as "format version 257; this dptrain
// reads version 1"): the CRC covers the header, so the file reads as corrupt.
TEST(CheckpointFormat, FlippedVersionBitReadsAsCorrupt) {
  const auto good = legacy_fixture("small-v2.dpt");
  for (size_t byte = 8; byte < 12; ++byte) {
    for (int bit = 0; bit < 8; ++bit) {
      SCOPED_TRACE("byte " + std::to_string(byte) + " bit " + std::to_string(bit));
      auto bytes = good;
      bytes[byte] ^= static_cast<uint8_t>(1 << bit);
      try {
        parse_checkpoint(bytes, "flip.dpt");
        ADD_FAILURE() << "a flipped version bit was accepted";
      } catch (const DataError& e) {
        const std::string message = e.what();
        EXPECT_NE(message.find("corrupt"), std::string::npos) << message;
        EXPECT_EQ(message.find("format version"), std::string::npos) << message;
      }
    }
  }
}

// Files of format version 1 (before the digest) and 2 still read, field for field as the
// checkpoint they were written from.
TEST(CheckpointFormat, VersionOneFilesStillReadAndRoundTrip) {
  const auto c = small_checkpoint_in_version(1);
  const auto bytes = legacy_fixture("small-v1.dpt");
  EXPECT_EQ(bytes[8], 1);
  // Version 1's CRC covers the payload alone.
  EXPECT_EQ(uint32_t{bytes[20]} | uint32_t{bytes[21]} << 8 | uint32_t{bytes[22]} << 16 |
                uint32_t{bytes[23]} << 24,
            ::crc32(0L, bytes.data() + 24, static_cast<uInt>(bytes.size() - 24)));
  const auto read = parse_checkpoint(bytes, "v1.dpt");
  EXPECT_EQ(read.format_version, 1u);
  EXPECT_TRUE(read.config.train_digest.empty());
  expect_same_checkpoint(c, read);
  expect_same_checkpoint(small_checkpoint_in_version(2),
                         parse_checkpoint(legacy_fixture("small-v2.dpt"), "v2.dpt"));
}

// A payload with a valid CRC but absurd contents: the reader still refuses, never allocates
// what a hostile size asks for, and never reads past the end.
TEST(CheckpointFormat, ConsistentDigestButAbsurdContentsAreDataErrors) {
  // The writer writes what it is given; the reader refuses what no run can have.
  const auto refused = [](const char* what, const std::function<void(Checkpoint&)>& edit,
                          const std::string& phrase) {
    SCOPED_TRACE(what);
    auto c = small_checkpoint();
    edit(c);
    expect_data_error([&] { parse_checkpoint(serialize_checkpoint(c), "edited.safetensors"); },
                      {"edited.safetensors: corrupt: impossible contents: " + phrase});
  };
  refused("width 0", [](Checkpoint& c) { c.config.width = 0; }, "width is 0 (dptrain writes 1 to 4096)");
  refused("negative epochs", [](Checkpoint& c) { c.epochs_done = -1; }, "the epochs done is -1");
  refused("step 10^6", [](Checkpoint& c) { c.step_in_epoch = 1000000; },
          "the step in the epoch is 1000000 (an epoch of 256 images in batches of 32 has 8 steps)");
  refused("global step 2^63 - 1", [](Checkpoint& c) { c.global_step = INT64_MAX; },
          "the global step is 9.22337e+18 (epoch 1 step 3 is global step 11");
  refused("a loss sum of -inf",
          [](Checkpoint& c) { c.partial_sums.loss_sum = -std::numeric_limits<double>::infinity(); },
          "the epoch's loss sum is -inf (a loss: >= 0, inf or nan)");
  refused("history of 2 for 1 epoch", [](Checkpoint& c) { c.history.push_back(c.history[0]); },
          "the history's length is 2");
  // And the run state's own JSON: a field missing or of the wrong type is named.
  const auto bytes = serialize_checkpoint(small_checkpoint());
  const std::string header = header_of(bytes);
  expect_data_error(
      [&] {
        parse_checkpoint(redigested(with_header(bytes, replaced(header, "global_step\\\":11",
                                                                "global_step\\\":\\\"11\\\""))),
                         "typed.safetensors");
      },
      {"typed.safetensors: corrupt: run state: global_step is not an integer of 64 bits"});
  // Note [One JSON text, one reading]: a field given twice, and bytes after a NUL (which
  // nlohmann's parser took for the end), digest refitted, are refused as the script refuses them.
  expect_data_error(
      [&] {
        parse_checkpoint(redigested(with_header(bytes, replaced(header, "global_step\\\":11",
                                                                "global_step\\\":11,\\\"global_step"
                                                                "\\\":12"))),
                         "twice.safetensors");
      },
      {"twice.safetensors: corrupt: the run state is not valid JSON: the name 'global_step' "
       "appears twice"});
  expect_data_error(
      [&] {
        parse_checkpoint(redigested(with_header(bytes, replaced(header, "\",\"dptrain.test_acc\"",
                                                                "\\u0000{}\",\"dptrain.test_acc\""))),
                         "nul.safetensors");
      },
      {"nul.safetensors: corrupt: the run state is not valid JSON: a NUL byte at byte"});
}

TEST(CheckpointFormat, LegacyConsistentCrcButAbsurdContentsAreDataErrors) {
  const auto c = small_checkpoint_in_version(2);
  // Rebuild the header around an edited payload, with the edited payload's own CRC.
  const auto with_payload = legacy_with_payload;
  const auto original = legacy_fixture("small-v2.dpt");
  const std::vector<uint8_t> payload(original.begin() + 24, original.end());
  // Sanity: rebuilding the unedited payload gives a readable file.
  EXPECT_NO_THROW(parse_checkpoint(with_payload(payload), "same.dpt"));

  // Offsets in the payload: kPosition and the rest above, for small_checkpoint's one epoch.
  ASSERT_EQ(c.config.train_digest.size(), 64u);
  const size_t history_bytes = 9 * 8 * c.history.size();
  const size_t tensor_count = kHistoryCount + 8 + history_bytes;
  ASSERT_EQ(tensor_count, kTensorCount);
  const size_t first_name_size = tensor_count + 8;
  struct Edit {
    const char* what;
    size_t at;
    uint64_t value;
    const char* phrase;
  };
  const Edit edits[] = {
      {"width 0", 0, 0, "impossible contents: width is 0 (dptrain writes 1 to 4096)"},
      {"negative epochs done", kPosition, uint64_t(-1), "the epochs done is -1"},
      // CRC-valid files whose position no run can reach.
      {"step 10^6 of an 8-step epoch", kPosition + 8, 1000000,
       "the step in the epoch is 1000000 (an epoch of 256 images in batches of 32 has 8 steps)"},
      {"a global step of 2^63 - 1", kPosition + 16, uint64_t{INT64_MAX},
       "epoch 1 step 3 is global step 11"},
      {"a global step one too many", kPosition + 16, 12, "the global step is 12"},
      {"a negative loss sum", kPosition + 24, 0xbff0000000000000ull /* -1.0 */,
       "the epoch's loss sum is -1 (a loss: >= 0, inf or nan)"},
      {"a loss sum of -inf", kPosition + 24, 0xfff0000000000000ull,
       "the epoch's loss sum is -inf (a loss: >= 0, inf or nan)"},
      {"more correct than counted", kPosition + 32, 0x4100000000000000ull /* 131072.0 */,
       "the epoch's correct count is 131072"},
      {"a batch size of 0", 3 * 8, 0, "the batch size is 0"},
      {"a digest of 2^40 bytes", 8 * 8, uint64_t{1} << 40, "digest"},
      {"a billion epochs of history", kHistoryCount, 1000000000, "epochs"},
      {"history longer than the file", kHistoryCount, 1000, "history of 1000 epochs"},
      {"2^40 tensors", tensor_count, uint64_t{1} << 40, "tensors"},
      {"a tensor name of 2^63 bytes", first_name_size, uint64_t{1} << 63, "tensor name"},
      {"a tensor name longer than the file", first_name_size, 1000, "truncated"},
  };
  for (const auto& edit : edits) {
    SCOPED_TRACE(edit.what);
    auto edited = payload;
    put_u64(edited, edit.at, edit.value);
    expect_data_error([&] { parse_checkpoint(with_payload(edited), "edited.dpt"); },
                      {"edited.dpt", edit.phrase});
  }
  {
    SCOPED_TRACE("two epochs done, one in the history");
    auto edited = payload;
    put_u64(edited, kPosition, 2);
    put_u64(edited, kPosition + 16, 2 * 8 + 3);  // the global step of epoch 2 step 3
    expect_data_error([&] { parse_checkpoint(with_payload(edited), "edited.dpt"); },
                      {"edited.dpt", "the history's length is 1"});
  }
  // The first tensor "w": name (8 + 1 bytes), dtype code, rank, one dimension, byte count.
  const size_t dtype_at = kFirstDtype;
  const size_t rank_at = kFirstRank;
  const size_t dim_at = kFirstDim;
  const size_t stored_at = kFirstStored;
  {
    auto edited = payload;
    edited[dtype_at] = 99;
    expect_data_error([&] { parse_checkpoint(with_payload(edited), "edited.dpt"); },
                      {"unknown dtype code in tensor w"});
  }
  {
    auto edited = payload;
    put_u64(edited, rank_at, 9);
    expect_data_error([&] { parse_checkpoint(with_payload(edited), "edited.dpt"); },
                      {"tensor w of rank 9"});
  }
  for (uint64_t dim : {uint64_t(-3), uint64_t{1} << 62, uint64_t{4}}) {
    SCOPED_TRACE("dimension " + std::to_string(static_cast<int64_t>(dim)));
    auto edited = payload;
    put_u64(edited, dim_at, dim);
    expect_data_error([&] { parse_checkpoint(with_payload(edited), "edited.dpt"); },
                      {"edited.dpt", "tensor w"});
  }
  {
    auto edited = payload;
    put_u64(edited, stored_at, 8);  // 3 floats are 12 bytes
    expect_data_error([&] { parse_checkpoint(with_payload(edited), "edited.dpt"); },
                      {"tensor w holds 8 bytes"});
  }
}

// ---- Python reads what dptrain writes (scripts/read_checkpoint.py) ----------------------------

// The script reads a checkpoint the C++ wrote: every tensor's name, dtype, shape and bytes, and the
// configuration and position, exactly.
TEST(CheckpointPython, ReadCheckpointScriptGivesEveryTensorAndThePosition) {
  const std::string python = DPTRAIN_TORCHRUN_PYTHON;
  if (python.empty()) GTEST_SKIP() << "no Python with torch found at configure time";
  TempDir dir;
  auto checkpoint = sample_checkpoint();
  // The script checks the tensors against the width-8 model, as dptrain's eval and resume do.
  ResNet model(ResNetOptions{kNumClasses, 1, checkpoint.config.width});
  checkpoint.tensors = model_tensors(*model);
  const std::string path = dir.file(checkpoint_file_name(2, 17));
  write_checkpoint_atomically(checkpoint, path);
  const std::string script =
      std::string(DPTRAIN_TEST_DATA_DIR) + "/../../scripts/read_checkpoint.py";
  const auto digests = run_command({python, script, path, "--tensor-digests"}, {}, 120);
  ASSERT_EQ(digests.exit_code, 0) << digests.err;
  std::string expected;
  for (const auto& [name, tensor] : checkpoint.tensors) {
    const auto t = tensor.contiguous();
    std::ostringstream shape;
    for (int64_t d = 0; d < t.dim(); ++d) shape << (d ? "x" : "") << t.size(d);
    const std::string dtype = t.scalar_type() == torch::kFloat32    ? "float32"
                              : t.scalar_type() == torch::kFloat64  ? "float64"
                              : t.scalar_type() == torch::kInt64    ? "int64"
                              : t.scalar_type() == torch::kBFloat16 ? "bfloat16"
                                                                    : "float16";
    const std::string bytes(static_cast<const char*>(t.data_ptr()),
                            static_cast<size_t>(t.numel()) * t.element_size());
    expected += name + " " + dtype + " " + (t.dim() ? shape.str() : "scalar") + " " +
                sha256_hex(bytes) + "\n";
  }
  EXPECT_EQ(digests.out, expected);

  const auto summary = run_command({python, script, path, "--json"}, {}, 120);
  ASSERT_EQ(summary.exit_code, 0) << summary.err;
  for (const std::string& field :
       {std::string("\"epochs_done\": 2"), std::string("\"step_in_epoch\": 17"),
        "\"global_step\": " + std::to_string(checkpoint.global_step), std::string("\"width\": 8"),
        "\"train_digest\": \"" + checkpoint.config.train_digest + "\"",
        std::string("\"seed\": 18364758544493064720"), std::string("\"format_version\": 3"),
        std::string("\"kind\": \"checkpoint\"")}) {
    EXPECT_NE(summary.out.find(field), std::string::npos) << field << "\n" << summary.out;
  }
  // A damaged file is refused with one line, in dptrain's words: a bit of the last tensor's data
  // flipped (the header's JSON is the first half of this small file).
  auto bytes = serialize_checkpoint(checkpoint);
  bytes[bytes.size() - 1] ^= 1;
  write_bytes(path, bytes);
  const auto damaged = run_command({python, script, path}, {}, 120);
  EXPECT_EQ(damaged.exit_code, 1);
  EXPECT_EQ(damaged.err, "error: checkpoint " + path +
                             ": corrupt: the content digest does not match (the file was damaged "
                             "or changed after dptrain wrote it)\n");
}

// A recipe beyond the book's, with the state it keeps.
Recipe sample_recipe() {
  Recipe r;
  r.sgd = SgdOptions{0.9, /*nesterov=*/true, 5e-4, /*weight_decay_skip_vectors=*/true};
  r.schedule = LrSchedule{LrShape::kOneCycle, /*warmup_epochs=*/1.5, 0, 0.1};
  r.label_smoothing = 0.1;
  r.augment = Augment::kCropFlip;
  r.crop_padding = 3;
  r.clip_grad_norm = 2;
  r.ema_decay = 0.999;
  return r;
}

TEST(CheckpointFormat, RecipeAndOptimizerStateRoundTripAndTheBooksWritesNone) {
  auto c = small_checkpoint();
  EXPECT_EQ(header_of(serialize_checkpoint(c)).find("recipe"), std::string::npos);
  c.config.recipe = sample_recipe();
  c.config.schedule_epochs = 10;
  c.state.emplace_back("momentum.w", torch::tensor({0.5f, -0.25f, 0.125f}));
  c.state.emplace_back("ema.w", torch::tensor({1.0f, -1.5f, 3.0f}));
  c.state.emplace_back("ema.n", torch::tensor(int64_t{42}, torch::kInt64));
  const auto bytes = serialize_checkpoint(c);
  const auto parsed = parse_checkpoint(bytes, "memory");
  EXPECT_EQ(recipe_flags(parsed.config.recipe), recipe_flags(sample_recipe()));
  EXPECT_EQ(parsed.config.recipe.crop_padding, 3);
  EXPECT_EQ(parsed.config.schedule_epochs, 10);
  ASSERT_EQ(parsed.tensors.size(), c.tensors.size());  // the model's, the state apart
  ASSERT_EQ(parsed.state.size(), c.state.size());
  for (size_t i = 0; i < c.state.size(); ++i) {
    EXPECT_EQ(parsed.state[i].first, c.state[i].first);
    EXPECT_TRUE(torch::equal(parsed.state[i].second, c.state[i].second)) << c.state[i].first;
  }
  EXPECT_EQ(serialize_checkpoint(parsed), bytes);
  // An impossible recipe is named as any impossible content.
  c.config.recipe.sgd.momentum = 0;
  expect_data_error([&] { parse_checkpoint(serialize_checkpoint(c), "edited.safetensors"); },
                    {"edited.safetensors: corrupt: impossible contents: the recipe is --nesterov",
                     "--nesterov needs --momentum above 0"});
}

TEST(CheckpointPython, ReadCheckpointScriptReadsTheRecipesStateAndBothRefuseAStranger) {
  const std::string python = DPTRAIN_TORCHRUN_PYTHON;
  if (python.empty()) GTEST_SKIP() << "no Python with torch found at configure time";
  TempDir dir;
  auto checkpoint = sample_checkpoint();
  ResNet model(ResNetOptions{kNumClasses, 1, checkpoint.config.width});
  checkpoint.tensors = model_tensors(*model);
  checkpoint.config.recipe = sample_recipe();
  checkpoint.config.schedule_epochs = 20;
  for (const auto& item : model->named_parameters()) {
    checkpoint.state.emplace_back(kMomentumPrefix + item.key(), item.value().detach() * 0.5);
  }
  for (const auto& [name, tensor] : model_tensors(*model)) {
    checkpoint.state.emplace_back(kAveragePrefix + name, tensor);
  }
  const std::string path = dir.file(checkpoint_file_name(2, 17));
  write_checkpoint_atomically(checkpoint, path);
  const std::string script =
      std::string(DPTRAIN_TEST_DATA_DIR) + "/../../scripts/read_checkpoint.py";
  const auto digests = run_command({python, script, path, "--tensor-digests"}, {}, 120);
  ASSERT_EQ(digests.exit_code, 0) << digests.err;
  EXPECT_EQ(static_cast<size_t>(std::count(digests.out.begin(), digests.out.end(), '\n')),
            checkpoint.tensors.size() + checkpoint.state.size());
  const auto summary = run_command({python, script, path, "--json"}, {}, 120);
  ASSERT_EQ(summary.exit_code, 0) << summary.err;
  EXPECT_NE(summary.out.find("\"lr_schedule\": \"onecycle\""), std::string::npos) << summary.out;
  const auto read = read_checkpoint(path, "checkpoint", accepted_in_memory(true));
  EXPECT_EQ(read.state.size(), checkpoint.state.size());
  // A state tensor of no tensor of the model's is refused by both, in the same words.
  checkpoint.state.emplace_back("ema.stranger", torch::zeros({2}));
  write_checkpoint_atomically(checkpoint, path);
  expect_data_error([&] { read_checkpoint(path, "checkpoint", accepted_in_memory(true)); },
                    {"holds tensor 'ema.stranger', which the width-8 model has not; not read"});
  const auto refused = run_command({python, script, path}, {}, 120);
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_NE(refused.err.find("holds tensor 'ema.stranger', which the width-8 model has not; "
                             "not read"),
            std::string::npos)
      << refused.err;
}

// ---- Atomic writes ----------------------------------------------------------------------

TEST(CheckpointFiles, WriteIntoMissingDirectoryIsADataErrorAndLeavesNothing) {
  TempDir dir;
  const std::string path = dir.file("missing/checkpoint-e0001-s000000.dpt");
  expect_data_error([&] { write_checkpoint_atomically(small_checkpoint(), path); },
                    {path, "cannot create"});
  EXPECT_FALSE(path_exists(dir.file("missing")));
  EXPECT_EQ(temporary_files_in(parent_directory(path)), std::vector<std::string>{});
}

TEST(CheckpointFiles, RewriteReplacesTheWholeFile) {
  TempDir dir;
  const std::string path = dir.file("c.dpt");
  write_checkpoint_atomically(sample_checkpoint(), path);  // the larger one first
  const auto small = small_checkpoint();
  write_checkpoint_atomically(small, path);
  EXPECT_EQ(file_size(path), static_cast<int64_t>(serialize_checkpoint(small).size()));
  expect_same_checkpoint(small, read_checkpoint(path));
}

// A checkpoint too big to fit: the write fails, the older checkpoint under the same name still
// reads, and no temporary file is left behind.
void expect_failed_write_keeps_older(const std::string& path, const std::string& cause) {
  SCOPED_TRACE(cause);
  const auto older = read_bytes(path);
  Checkpoint big = small_checkpoint();
  big.global_step = 99;
  big.tensors.emplace_back("big", torch::ones({50000}));  // 200 kB
  expect_data_error([&] { write_checkpoint_atomically(big, path); },
                    {path, "cannot write", cause, "previous checkpoints are untouched"});
  EXPECT_EQ(temporary_files_in(parent_directory(path)), std::vector<std::string>{});
  EXPECT_EQ(read_bytes(path), older);
  EXPECT_EQ(read_checkpoint(path).global_step, small_checkpoint().global_step);
}

TEST(CheckpointFiles, FailedWriteOverFileSizeLimitKeepsTheOlderCheckpoint) {
  TempDir dir;
  const std::string path = dir.file("checkpoint-e0001-s000000.dpt");
  write_checkpoint_atomically(small_checkpoint(), path);
  {
    // Only this test writes while the limit holds; the process's other files are untouched.
    FileSizeLimit limit(64 * 1024);
    ASSERT_TRUE(limit.ok()) << std::strerror(errno);
    expect_failed_write_keeps_older(path, std::strerror(EFBIG));
  }
  // Without the limit the same write succeeds: the failure was the limit's.
  Checkpoint big = small_checkpoint();
  big.tensors.emplace_back("big", torch::ones({50000}));
  write_checkpoint_atomically(big, path);
  EXPECT_EQ(read_checkpoint(path).tensors.size(), 3u);
}

// A link planted at a guessable temporary name ("<path>.tmp" -> a victim) is never written
// through: temporary names are the writer's own and created exclusively, so the link and its
// target are left as they were.
TEST(CheckpointFiles, PlantedLinkAtATemporaryNameIsNeverWrittenThrough) {
  TempDir dir;
  const std::string path = dir.file("checkpoint-e0001-s000000.dpt");
  const std::string victim = dir.file("victim.txt");
  write_bytes(victim, {'k', 'e', 'e', 'p'});
  ASSERT_EQ(::symlink(victim.c_str(), (path + ".tmp").c_str()), 0) << std::strerror(errno);
  write_checkpoint_atomically(small_checkpoint(), path);
  EXPECT_EQ(read_bytes(victim), (std::vector<uint8_t>{'k', 'e', 'e', 'p'}));
  struct stat info {};
  ASSERT_EQ(::lstat((path + ".tmp").c_str(), &info), 0);
  EXPECT_TRUE(S_ISLNK(info.st_mode));
  expect_same_checkpoint(small_checkpoint(), read_checkpoint(path));
}

// `--save-model /dev/full` must not rename a file over the device node. Only a regular file
// (or nothing) is replaced; anything else is an error naming it, and stays.
TEST(CheckpointFiles, NonRegularTargetIsRefusedAndLeftInPlace) {
  TempDir dir;
  const std::string fifo = dir.file("checkpoint-e0001-s000000.dpt");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0) << std::strerror(errno);
  expect_data_error([&] { write_checkpoint_atomically(small_checkpoint(), fifo); },
                    {fifo, "is a FIFO", "only a regular file is replaced"});
  const std::string link = dir.file("link.dpt");
  ASSERT_EQ(::symlink("/dev/full", link.c_str()), 0);
  expect_data_error([&] { write_checkpoint_atomically(small_checkpoint(), link); },
                    {link, "is a symbolic link"});
  struct stat info {};
  ASSERT_EQ(::lstat(fifo.c_str(), &info), 0);
  EXPECT_TRUE(S_ISFIFO(info.st_mode));
  ASSERT_EQ(::lstat(link.c_str(), &info), 0);
  EXPECT_TRUE(S_ISLNK(info.st_mode));
  EXPECT_EQ(temporary_files_in(dir.path()), std::vector<std::string>{});
}

// A FIFO named like a checkpoint would hang a blocking reader for ever. It is refused at once.
TEST(CheckpointFiles, FifoIsRefusedWithoutWaitingForAWriter) {
  TempDir dir;
  const std::string fifo = dir.file("checkpoint-e0001-s000000.dpt");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0) << std::strerror(errno);
  expect_data_error([&] { read_checkpoint(fifo); }, {fifo, "not a regular file", "FIFO"});
  std::vector<std::string> skipped;
  EXPECT_FALSE(newest_valid_checkpoint(dir.path(), &skipped).has_value());
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_NE(skipped[0].find("FIFO"), std::string::npos) << skipped[0];
}

// A real full file system: a 64 KiB tmpfs. Needs the right to mount (root in most containers).
TEST(CheckpointFiles, FailedWriteOnAFullTmpfsKeepsTheOlderCheckpoint) {
  TempDir dir;
  const std::string mount_point = dir.file("small");
  make_directories(mount_point);
  if (::mount("tmpfs", mount_point.c_str(), "tmpfs", 0, "size=64k") != 0) {
    GTEST_SKIP() << "cannot mount a tmpfs here (" << std::strerror(errno)
                 << "); the file-size-limit and /dev/full tests cover the failed write";
  }
  struct Unmount {
    std::string path;
    ~Unmount() { ::umount2(path.c_str(), MNT_DETACH); }
  } unmount{mount_point};
  const std::string path = mount_point + "/checkpoint-e0001-s000000.dpt";
  write_checkpoint_atomically(small_checkpoint(), path);
  expect_failed_write_keeps_older(path, std::strerror(ENOSPC));
  EXPECT_EQ(list_directory(mount_point), std::vector<std::string>{"checkpoint-e0001-s000000.dpt"});
}

// ---- newest_valid_checkpoint --------------------------------------------------------------

// small_checkpoint at another position, with the history and epoch length that position needs
// (100 steps an epoch).
Checkpoint checkpoint_at(int64_t epochs_done, int64_t step) {
  auto c = small_checkpoint();
  c.config.train_size = 100 * c.config.batch_size;
  c.epochs_done = epochs_done;
  c.step_in_epoch = step;
  c.global_step = epochs_done * 100 + step;
  // The sums of `step` full batches, the only ones a run can have there.
  const double seen = static_cast<double>(step * c.config.batch_size);
  c.partial_sums = {seen > 0 ? 6.5 : 0.0, std::min(40.0, seen), seen};
  c.history.clear();
  for (int64_t epoch = 1; epoch <= epochs_done; ++epoch) {
    c.history.push_back(stats_for_epoch(1));
    c.history.back().epoch = epoch;
    c.history.back().epochs = std::max<int64_t>(epochs_done, 7);  // a run of that many at least
  }
  return c;
}

TEST(NewestValidCheckpoint, MissingOrEmptyDirectoryHasNone) {
  TempDir dir;
  std::vector<std::string> skipped;
  EXPECT_FALSE(newest_valid_checkpoint(dir.file("absent"), &skipped).has_value());
  EXPECT_FALSE(newest_valid_checkpoint(dir.path(), &skipped).has_value());
  EXPECT_TRUE(skipped.empty());
}

TEST(NewestValidCheckpoint, PicksTheLatestPosition) {
  TempDir dir;
  for (const auto& [epoch, step] :
       std::vector<std::pair<int64_t, int64_t>>{{0, 5}, {1, 0}, {1, 12}, {9999, 3}, {10000, 0}}) {
    write_checkpoint_atomically(checkpoint_at(epoch, step),
                                dir.file(checkpoint_file_name(epoch, step)));
  }
  // Neither other files nor a leftover temporary are candidates.
  write_bytes(dir.file("notes.txt"), {'h', 'i'});
  write_bytes(dir.file("checkpoint-e99999-s000000.safetensors.tmp"),
              serialize_checkpoint(checkpoint_at(99999, 0)));
  std::vector<std::string> skipped;
  const auto found = newest_valid_checkpoint(dir.path(), &skipped);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->first, dir.file("checkpoint-e10000-s000000.safetensors"));
  EXPECT_EQ(found->second.global_step, 10000 * 100);
  EXPECT_TRUE(skipped.empty());
}

// A directory an older dptrain wrote into (.dpt, format version 2) resumes from its newest
// file, whichever format holds it; --fresh removes both kinds.
TEST(NewestValidCheckpoint, OlderFormatFilesCountByTheirPosition) {
  TempDir dir;
  write_checkpoint_atomically(checkpoint_at(1, 0), dir.file(checkpoint_file_name(1, 0)));
  write_bytes(dir.file("checkpoint-e0002-s000000.dpt"),
              legacy_fixture("checkpoint-e0002-s000000.dpt"));  // checkpoint_at(2, 0)
  const auto found = newest_valid_checkpoint(dir.path(), nullptr);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->first, dir.file("checkpoint-e0002-s000000.dpt"));
  EXPECT_EQ(found->second.format_version, 2u);
  EXPECT_EQ(checkpoint_file_names(dir.path()),
            (std::vector<std::string>{checkpoint_file_name(1, 0), "checkpoint-e0002-s000000.dpt"}));
  EXPECT_EQ(remove_checkpoints_for_fresh_start(dir.path()).size(), 2u);
  EXPECT_TRUE(checkpoint_file_names(dir.path()).empty());
}

// Not the file name picks the newest (a copy of an epoch-1 checkpoint named checkpoint-e0009-...
// would win): the position stored inside decides.
TEST(NewestValidCheckpoint, PicksByTheStoredPositionNotTheName) {
  TempDir dir;
  write_checkpoint_atomically(checkpoint_at(1, 0), dir.file(checkpoint_file_name(1, 0)));
  write_checkpoint_atomically(checkpoint_at(2, 0), dir.file(checkpoint_file_name(2, 0)));
  write_checkpoint_atomically(checkpoint_at(1, 0), dir.file(checkpoint_file_name(9, 0)));
  write_checkpoint_atomically(checkpoint_at(1, 7), dir.file(checkpoint_file_name(0, 1)));
  const auto found = newest_valid_checkpoint(dir.path(), nullptr);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->first, dir.file(checkpoint_file_name(2, 0)));
  EXPECT_EQ(found->second.epochs_done, 2);
  EXPECT_EQ(found->second.step_in_epoch, 0);
}

TEST(NewestValidCheckpoint, SkipsCorruptNewerFilesAndSaysWhy) {
  TempDir dir;
  const std::string good = dir.file(checkpoint_file_name(1, 0));
  write_checkpoint_atomically(checkpoint_at(1, 0), good);
  // Newer, but one flipped payload byte; newer still, cut short; newest, not ours at all.
  auto flipped = serialize_checkpoint(checkpoint_at(1, 4));
  flipped[flipped.size() - 2] ^= 0x10;  // in the data
  write_bytes(dir.file(checkpoint_file_name(1, 4)), flipped);
  auto cut = serialize_checkpoint(checkpoint_at(2, 0));
  cut.resize(cut.size() / 2);
  write_bytes(dir.file(checkpoint_file_name(2, 0)), cut);
  write_bytes(dir.file(checkpoint_file_name(3, 0)), {'P', 'K', 3, 4});

  std::vector<std::string> skipped;
  const auto found = newest_valid_checkpoint(dir.path(), &skipped);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->first, good);
  EXPECT_EQ(found->second.global_step, 100);
  ASSERT_EQ(skipped.size(), 3u);
  // Newest first, each naming its file and its fault.
  EXPECT_NE(skipped[0].find(checkpoint_file_name(3, 0)), std::string::npos) << skipped[0];
  EXPECT_NE(skipped[0].find("not a dptrain checkpoint"), std::string::npos) << skipped[0];
  EXPECT_NE(skipped[1].find(checkpoint_file_name(2, 0)), std::string::npos) << skipped[1];
  EXPECT_NE(skipped[1].find("truncated"), std::string::npos) << skipped[1];
  EXPECT_NE(skipped[2].find(checkpoint_file_name(1, 4)), std::string::npos) << skipped[2];
  EXPECT_NE(skipped[2].find("digest does not match"), std::string::npos) << skipped[2];

  // No valid file at all: nothing, and every file listed.
  remove_path(good);
  skipped.clear();
  EXPECT_FALSE(newest_valid_checkpoint(dir.path(), &skipped).has_value());
  EXPECT_EQ(skipped.size(), 3u);
  // A null list is allowed.
  EXPECT_FALSE(newest_valid_checkpoint(dir.path(), nullptr).has_value());
}

TEST(NewestValidCheckpoint, UnlistableDirectoryIsADataError) {
  TempDir dir;
  write_bytes(dir.file("file"), {1});
  expect_data_error([&] { newest_valid_checkpoint(dir.file("file"), nullptr); },
                    {dir.file("file"), "cannot list"});
}

// ---- check_checkpoint_matches -------------------------------------------------------------

TEST(CheckCheckpointMatches, NamesEveryDifferingModelSettingWithBothValues) {
  const CheckpointConfig saved{8, 10, 1, 32, 0.1, 1, 100, 1, "", Recipe{}, 0};
  // Settings of the run, not of the model, may differ.
  EXPECT_NO_THROW(check_checkpoint_matches(
      saved, CheckpointConfig{8, 10, 1, 64, 0.5, 2, 50, 4, "", Recipe{}, 0}, "c.dpt"));
  try {
    check_checkpoint_matches(
        saved, CheckpointConfig{16, 10, 1, 32, 0.1, 1, 100, 1, "", Recipe{}, 0}, "c.dpt");
    ADD_FAILURE() << "no UsageError for another width";
  } catch (const UsageError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("c.dpt"), std::string::npos) << message;
    EXPECT_NE(message.find("--width 8 (this run: 16)"), std::string::npos) << message;
  }
  try {
    check_checkpoint_matches(
        saved, CheckpointConfig{4, 100, 3, 32, 0.1, 1, 100, 1, "", Recipe{}, 0}, "c.dpt");
    ADD_FAILURE() << "no UsageError for another model";
  } catch (const UsageError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("--width 8 (this run: 4)"), std::string::npos) << message;
    EXPECT_NE(message.find("classes 10 (this run: 100)"), std::string::npos) << message;
    EXPECT_NE(message.find("input channels 1 (this run: 3)"), std::string::npos) << message;
  }
}

// ---- model_tensors / load_model_tensors ----------------------------------------------------

class LoadModelTensors : public ::testing::Test {
 protected:
  LoadModelTensors()
      : source_(ResNetOptions{kNumClasses, 1, 2}), target_(ResNetOptions{kNumClasses, 1, 2}) {
    init_reference_weights(*source_, 1);
    init_reference_weights(*target_, 2);
    // Buffers that differ from a fresh model's too.
    torch::NoGradGuard no_grad;
    for (auto& b : source_->buffers()) b.add_(1);
    tensors_ = model_tensors(*source_);
  }
  ResNet source_, target_;
  std::vector<std::pair<std::string, torch::Tensor>> tensors_;
};

TEST_F(LoadModelTensors, RoundTripCopiesEveryParameterAndBuffer) {
  EXPECT_EQ(tensors_.size(), source_->parameters().size() + source_->buffers().size());
  load_model_tensors(*target_, tensors_, "c.dpt");
  const auto loaded = model_tensors(*target_);
  ASSERT_EQ(loaded.size(), tensors_.size());
  for (size_t i = 0; i < loaded.size(); ++i) {
    EXPECT_EQ(loaded[i].first, tensors_[i].first);
    EXPECT_TRUE(torch::equal(loaded[i].second, tensors_[i].second)) << loaded[i].first;
  }
  // Copies, not views: changing the model afterwards leaves the tensors alone.
  torch::NoGradGuard no_grad;
  for (auto& p : target_->parameters()) p.zero_();
  EXPECT_FALSE(torch::equal(tensors_.front().second, torch::zeros_like(tensors_.front().second)));
}

TEST_F(LoadModelTensors, MissingTensorIsNamed) {
  const std::string dropped = tensors_[3].first;
  tensors_.erase(tensors_.begin() + 3);
  expect_data_error([&] { load_model_tensors(*target_, tensors_, "c.dpt"); },
                    {"c.dpt", "has no tensor '" + dropped + "'"});
}

TEST_F(LoadModelTensors, WrongShapeOrDtypeIsNamedWithBothShapes) {
  auto& [name, tensor] = tensors_[0];
  const auto original = tensor;
  auto wrong_shape = original.sizes().vec();
  wrong_shape[0] += 1;
  tensor = torch::zeros(wrong_shape);
  std::ostringstream saved_shape, model_shape;
  saved_shape << tensor.sizes();
  model_shape << original.sizes();
  expect_data_error([&] { load_model_tensors(*target_, tensors_, "c.dpt"); },
                    {"c.dpt", "tensor '" + name + "'", saved_shape.str(), model_shape.str()});
  tensor = original.to(torch::kFloat64);
  expect_data_error([&] { load_model_tensors(*target_, tensors_, "c.dpt"); },
                    {"c.dpt", "tensor '" + name + "'", "Double", "Float"});
}

TEST_F(LoadModelTensors, ExtraOrDuplicateTensorsAreRefused) {
  auto extra = tensors_;
  extra.emplace_back("not.in.the.model", torch::zeros({1}));
  expect_data_error(
      [&] { load_model_tensors(*target_, extra, "c.dpt"); },
      {"c.dpt", "holds " + std::to_string(extra.size()) + " tensors where the model has " +
                    std::to_string(tensors_.size())});
  auto duplicate = tensors_;
  duplicate.push_back(tensors_[0]);
  expect_data_error([&] { load_model_tensors(*target_, duplicate, "c.dpt"); },
                    {"c.dpt", "appears twice"});
}

// ---- prepare_checkpoint_directory -------------------------------------------------------------

TEST(PrepareCheckpointDirectory, CreatesNestedDirectories) {
  TempDir dir;
  const std::string nested = dir.file("a/b/c");
  prepare_checkpoint_directory(nested);
  EXPECT_TRUE(path_exists(nested));
  EXPECT_FALSE(is_regular_file(nested));
  prepare_checkpoint_directory(nested);  // again: already there is fine
  prepare_checkpoint_directory(dir.file("d/e/"));
  EXPECT_TRUE(path_exists(dir.file("d/e")));
  // A relative path, from the current directory.
  const std::string cwd = current_directory();
  change_directory(dir.path());
  EXPECT_NO_THROW(prepare_checkpoint_directory("rel/ative"));
  change_directory(cwd);
  EXPECT_TRUE(path_exists(dir.file("rel/ative")));
}

TEST(PrepareCheckpointDirectory, AFileInTheWayIsADataError) {
  TempDir dir;
  write_bytes(dir.file("file"), {1, 2, 3});
  expect_data_error([&] { prepare_checkpoint_directory(dir.file("file")); },
                    {dir.file("file"), "not a directory"});
  expect_data_error([&] { prepare_checkpoint_directory(dir.file("file/sub")); },
                    {dir.file("file/sub"), "cannot create"});
  EXPECT_TRUE(is_regular_file(dir.file("file")));
  EXPECT_EQ(file_size(dir.file("file")), 3);
}


// ---- Hostile files around the checkpoints -----------------------------------------------------

// A hard link planted at the lock's name must not have the linked file truncated and overwritten
// with the holder's line (O_NOFOLLOW stops only symbolic links).
TEST(CheckpointDirectoryLockFile, HardLinkAtTheLockNameIsRefusedAndTheFileKept) {
  TempDir dir;
  const std::string victim = dir.file("victim.txt");
  write_bytes(victim, {'k', 'e', 'e', 'p'});
  ASSERT_EQ(::link(victim.c_str(), dir.file(".dptrain.lock").c_str()), 0);
  expect_data_error([&] { CheckpointDirectoryLock lock(dir.path()); },
                    {dir.file(".dptrain.lock"), "has 2 hard links", "remove it"});
  EXPECT_EQ(read_text(victim), "keep");
}

// A foreign lock file's text reached the terminal raw, cut at its first newline.
TEST(CheckpointDirectoryLockFile, AHoldersTextIsEscaped) {
  TempDir dir;
  const std::string path = dir.file(".dptrain.lock");
  write_bytes(path, {'\x1b', '[', '2', 'J', 'p', 'i', 'd', '\n', 'x'});
  const int fd = ::open(path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX), 0);  // another open file: it conflicts even in this process
  const std::string message =
      expect_throws<UsageError>([&] { CheckpointDirectoryLock lock(dir.path()); },
                                {"is in use by another dptrain run (\\x1b[2Jpid\\x0ax)"});
  EXPECT_EQ(message.find('\x1b'), std::string::npos);
  ::close(fd);
}

TEST(Printable, EscapesEveryByteThatIsNotPrintableAscii) {
  EXPECT_EQ(printable("plain text 0-9 ~"), "plain text 0-9 ~");
  EXPECT_EQ(printable(std::string("a\nb\tc\x1b\x7f\xff\\", 9)), "a\\x0ab\\x09c\\x1b\\x7f\\xff\\\\");
  EXPECT_EQ(printable(std::string("\0", 1)), "\\x00");
}

// A tensor name holding an escape sequence is escaped in the messages that show it.
TEST(CheckpointFormat, TensorNamesInMessagesAreEscaped) {
  auto c = small_checkpoint();
  c.tensors.emplace_back("\x1b]0;evil\x07", torch::zeros({1}));
  const auto bytes = serialize_checkpoint(c);
  // JSON writes the name's control characters as \u escapes; the message shows them escaped.
  const std::string header = header_of(bytes);
  const std::string dtype = "\"\\u001b]0;evil\\u0007\":{\"dtype\":\"F32\"";
  const std::string message = expect_throws<DataError>(
      [&] {
        parse_checkpoint(with_header(bytes, replaced(header, dtype, "\"\\u001b]0;evil\\u0007\":{\"dtype\":\"U8\"")),
                         "names.safetensors");
      },
      {"tensor '\\x1b]0;evil\\x07' has dtype \"U8\""});
  EXPECT_EQ(message.find('\x1b'), std::string::npos);
}

TEST(CheckpointFormat, LegacyTensorNamesInMessagesAreEscaped) {
  // small_checkpoint and a tensor named `evil`, zeros({1}).
  const std::string evil = "\x1b]0;evil\x07";
  auto bytes = legacy_fixture("small-v2-escaped-name.dpt");
  // The last tensor: name length and name, dtype code (4), rank (8), one dimension, byte count,
  // 4 bytes of data.
  const size_t dtype_at = bytes.size() - 4 - 8 - 8 - 8 - 4;
  ASSERT_EQ(std::string(bytes.begin() + dtype_at - evil.size(), bytes.begin() + dtype_at), evil);
  bytes[dtype_at] = 99;
  fix_crc(bytes);
  const std::string message = expect_throws<DataError>(
      [&] { parse_checkpoint(bytes, "names.dpt"); }, {"tensor \\x1b]0;evil\\x07"});
  EXPECT_EQ(message.find('\x1b'), std::string::npos);
}

// The header first: a file larger than any checkpoint of the model it claims is refused unread
// (a sparse 20 GiB file cost nothing to make and 20 GiB to read).
TEST(CheckpointFiles, FileLargerThanItsModelCanHoldIsRefusedUnread) {
  TempDir dir;
  const std::string path = dir.file("big.safetensors");
  // A width-4 checkpoint whose one tensor claims more bytes than a width-4 model can hold; the
  // file is sparse, as long as its header says.
  const uint64_t limit = checkpoint_size_limit(4, 10, 1);
  const uint64_t count = limit / 8;
  const auto file = header_claiming(small_checkpoint(), count * 8);
  write_bytes(path, file);
  const uint64_t size = file.size() + count * 8;
  ASSERT_GT(size, limit);
  ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(size)), 0);
  expect_data_error([&] { read_checkpoint(path); },
                    {"checkpoint " + path + ": " + std::to_string(size) +
                         " bytes, more than a file of a width-4 model can hold",
                     "not read"});
  // The bound holds what dptrain writes: the real model's tensors.
  ResNet model(ResNetOptions{kNumClasses, 1, 8});
  Checkpoint real = small_checkpoint();
  real.config.width = 8;
  real.tensors = model_tensors(*model);
  EXPECT_LT(serialize_checkpoint(real).size(), checkpoint_size_limit(8, kNumClasses, 1));
}

// --fresh removed any file named checkpoint-*.dpt, and stopped half-way on one it could not
// remove. It removes dptrain checkpoints only, after checking all of them.
TEST(FreshStart, RemovesCheckpointsOnlyAndAllOrNone) {
  TempDir dir;
  const std::string first = dir.file(checkpoint_file_name(1, 0));
  const std::string second = dir.file(checkpoint_file_name(2, 0));
  write_checkpoint_atomically(checkpoint_at(1, 0), first);
  write_checkpoint_atomically(checkpoint_at(2, 0), second);
  const std::string fifo = dir.file(checkpoint_file_name(3, 0));
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  expect_throws<UsageError>([&] { remove_checkpoints_for_fresh_start(dir.path()); },
                            {"--fresh: " + fifo + ": it is a FIFO", "nothing was removed"});
  EXPECT_TRUE(is_regular_file(first));
  EXPECT_TRUE(is_regular_file(second));
  ASSERT_EQ(::unlink(fifo.c_str()), 0);
  // A second name for a checkpoint is not removed either: the other name would keep it.
  ASSERT_EQ(::link(second.c_str(), dir.file("kept.dpt").c_str()), 0);
  expect_throws<UsageError>([&] { remove_checkpoints_for_fresh_start(dir.path()); },
                            {second + ": it has 2 hard links"});
  ASSERT_EQ(::unlink(dir.file("kept.dpt").c_str()), 0);
  EXPECT_EQ(remove_checkpoints_for_fresh_start(dir.path()),
            (std::vector<std::string>{first, second}));
  EXPECT_TRUE(checkpoint_file_names(dir.path()).empty());
}

// Temporaries of writers that are gone are removed; a live writer's, and other names, stay.
TEST(FreshStart, StaleTemporariesOfDeadWritersAreRemoved) {
  TempDir dir;
  const pid_t gone = fork();
  if (gone == 0) _exit(0);
  ASSERT_GT(gone, 0);
  waitpid(gone, nullptr, 0);
  const std::string name = checkpoint_file_name(1, 0);
  const std::string stale = dir.file(name + "." + std::to_string(gone) + "-12.tmp");
  const std::string mine = dir.file(name + "." + std::to_string(::getpid()) + "-0.tmp");
  const std::string odd = dir.file(name + ".x" + std::to_string(gone) + "-0.tmp");
  for (const auto& path : {stale, mine, odd}) write_bytes(path, {1});
  EXPECT_EQ(remove_stale_temporaries(dir.path()), std::vector<std::string>{stale});
  EXPECT_FALSE(path_exists(stale));
  EXPECT_TRUE(path_exists(mine));
  EXPECT_TRUE(path_exists(odd));
}

// ---- Bounds from what the run can use; contents no run can have ----------------------------

// A real model's checkpoint of width `width`, at small_checkpoint's position.
Checkpoint model_checkpoint(int64_t width) {
  Checkpoint c = small_checkpoint();
  c.config.width = width;
  ResNet model(ResNetOptions{kNumClasses, 1, width});
  c.tensors = model_tensors(*model);
  return c;
}

// A sparse file whose header claims width 4096 must not be read whole by a --width 8 resume
// (4.4 GB), as a bound from the file's own word would have it. The run's width bounds it, and
// the header is refused before the data is read: this process reads the header, not the 4.4 GB.
TEST(CheckpointBound, AClaimedWidthTheRunDoesNotBuildIsRefusedUnread) {
  TempDir dir;
  const std::string path = dir.file("wide.safetensors");
  Checkpoint wide = small_checkpoint();
  wide.config.width = 4096;
  const uint64_t data = uint64_t{4400} << 20;
  const auto file = header_claiming(wide, data);
  write_bytes(path, file);
  ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(file.size() + data)), 0);
  // What this process reads while refusing: the header, never the 4.4 GB behind it (a sparse
  // file reads fast, so wall time could not tell).
  const int64_t read_before = bytes_read_by("self");
  ASSERT_GE(read_before, 0) << "no /proc/self/io to count the bytes read";
  expect_data_error([&] { read_checkpoint(path, "checkpoint", accepted_run_model(8)); },
                    {"checkpoint " + path + " was written for another model: --width 4096 " +
                         "(this run: 8); not read"});
  // eval's --width: the same check, as a usage error naming the flag.
  expect_throws<UsageError>(
      [&] { read_model_weights(path, "--model", accepted_run_model(8, /*width_from_flag=*/true)); },
      {"--width 8: --model " + path + " holds a model of width 4096", "not read"});
  // eval without --width: as wide as the memory allows, and no wider.
  AcceptedModel small_machine = accepted_in_memory(/*model_tensors=*/true);
  small_machine.max_width = 64;
  small_machine.available_bytes = int64_t{1} << 30;
  expect_throws<UsageError>([&] { read_checkpoint(path, "checkpoint", small_machine); },
                            {"checkpoint " + path + ": this machine cannot hold a width-4096 model",
                             "1.00 GiB of memory is available (at most width 64); not read"});
  EXPECT_LT(bytes_read_by("self") - read_before, int64_t{1} << 20)
      << "three refusals read more than a header's worth of " << path;
  // The legacy reader takes the same bound from the run.
  const std::string old = dir.file("old.dpt");
  write_bytes(old, legacy_fixture("small-v2.dpt"));
  expect_data_error([&] { read_checkpoint(old, "checkpoint", accepted_run_model(8)); },
                    {"checkpoint " + old + " was written for another model: --width 4 (this run: "
                     "8); not read"});
}

// The run's width is not enough: the header's tensors must be the model's, names, shapes and
// dtypes, before the data is read; the model's own file reads.
TEST(CheckpointBound, TheHeadersTensorsMustBeTheRunsModel) {
  TempDir dir;
  const std::string path = dir.file("c.safetensors");
  write_bytes(path, serialize_checkpoint(model_checkpoint(8)));
  const auto read = read_checkpoint(path, "checkpoint", accepted_run_model(8));
  EXPECT_EQ(read.tensors.size(), model_checkpoint(8).tensors.size());
  EXPECT_EQ(read_checkpoint(path, "checkpoint", accepted_in_memory(true)).config.width, 8);

  Checkpoint other_stem = model_checkpoint(8);
  other_stem.tensors[0].second = torch::zeros({16, 1, 3, 3});
  ASSERT_EQ(other_stem.tensors[0].first, "0.weight");
  write_bytes(path, serialize_checkpoint(other_stem));
  expect_data_error([&] { read_checkpoint(path, "checkpoint", accepted_run_model(8)); },
                    {"checkpoint " + path + ": tensor '0.weight' is F32[16,1,3,3], the width-8 " +
                     "model's is F32[8,1,3,3]; not read"});
  Checkpoint doubled = model_checkpoint(8);
  doubled.tensors[1].second = doubled.tensors[1].second.to(torch::kFloat64);
  write_bytes(path, serialize_checkpoint(doubled));
  expect_data_error([&] { read_checkpoint(path, "checkpoint", accepted_run_model(8)); },
                    {"tensor '" + doubled.tensors[1].first + "' is F64", "; not read"});
  Checkpoint extra = model_checkpoint(8);
  extra.tensors.emplace_back("\x1b[2Jextra", torch::zeros({1}));
  write_bytes(path, serialize_checkpoint(extra));
  expect_data_error([&] { read_checkpoint(path, "checkpoint", accepted_run_model(8)); },
                    {"holds tensor '\\x1b[2Jextra', which the width-8 model has not; not read"});
  Checkpoint fewer = model_checkpoint(8);
  fewer.tensors.pop_back();
  write_bytes(path, serialize_checkpoint(fewer));
  // dptrain's own files are exact (Note [A state dict from PyTorch is read as PyTorch reads
  // it]): the buffer a plain state dict may lack is named.
  expect_data_error([&] { read_checkpoint(path, "checkpoint", accepted_run_model(8)); },
                    {"checkpoint " + path + ": has no tensor 'resnet_block4.1.bn2." +
                     "num_batches_tracked' of the width-8 model; not read"});
}

// Note [A state dict from PyTorch is read as PyTorch reads it]: a plain file's floating-point
// weights of another dtype are converted (exactly from F16 and BF16), its absent
// num_batches_tracked are 0, both said in one notice; the rest is refused, naming the tensor.
TEST(ModelWeights, AStateDictFromPyTorchIsReadAsPyTorchReadsIt) {
  TempDir dir;
  const std::string path = dir.file("state_dict.safetensors");
  torch::manual_seed(3);
  ResNet model(ResNetOptions{kNumClasses, 1, 4});
  const auto tensors = model_tensors(*model);
  const auto write = [&](const std::function<bool(std::pair<std::string, torch::Tensor>&)>& edit) {
    NamedTensors file;
    for (auto t : tensors) {
      if (edit(t)) file.push_back(std::move(t));
    }
    const auto bytes = serialize_safetensors(file, {});
    write_bytes(path, bytes);
  };
  const auto read = [&] { return read_model_weights(path, "--model", accepted_in_memory(true)); };
  for (const auto dtype : {torch::kFloat16, torch::kBFloat16, torch::kFloat64}) {
    SCOPED_TRACE(safetensors_dtype_name(dtype));
    write([&](auto& t) {
      if (t.second.is_floating_point()) t.second = t.second.to(dtype);
      return true;
    });
    const auto weights = read();
    EXPECT_EQ(weights.width, 4);
    ASSERT_EQ(weights.tensors.size(), tensors.size());
    for (size_t i = 0; i < tensors.size(); ++i) {
      const auto& [name, tensor] = weights.tensors[i];
      EXPECT_EQ(name, tensors[i].first);
      EXPECT_EQ(tensor.scalar_type(), tensors[i].second.scalar_type()) << name;
      const auto expected = tensors[i].second.is_floating_point()
                                ? tensors[i].second.to(dtype).to(torch::kFloat32)
                                : tensors[i].second;
      EXPECT_TRUE(tensor.equal(expected)) << name;
    }
    EXPECT_EQ(weights.notice, "its " + safetensors_dtype_name(dtype) +
                                  " weights converted to the model's F32 (" +
                                  (dtype == torch::kFloat64 ? "F64 rounded to the nearest F32"
                                                            : "exactly") + ")");
  }
  write([](auto& t) { return t.first.find("num_batches_tracked") == std::string::npos; });
  auto weights = read();
  ASSERT_EQ(weights.tensors.size(), tensors.size());
  EXPECT_EQ(weights.tensors.back().first, "resnet_block4.1.bn2.num_batches_tracked");
  EXPECT_EQ(weights.tensors.back().second.item<int64_t>(), 0);
  EXPECT_EQ(weights.notice, "its 17 absent BatchNorm num_batches_tracked buffers set to 0, as "
                            "PyTorch's load_state_dict sets them");
  write([](auto& t) {
    if (t.second.is_floating_point()) t.second = t.second.to(torch::kFloat16);
    return t.first.find("num_batches_tracked") == std::string::npos;
  });
  EXPECT_EQ(read().notice, "its F16 weights converted to the model's F32 (exactly); its 17 absent "
                           "BatchNorm num_batches_tracked buffers set to 0, as PyTorch's "
                           "load_state_dict sets them");
  write([](auto&) { return true; });
  EXPECT_EQ(read().notice, "");

  const std::string refused = "--model " + path + ": ";
  write([](auto& t) {
    if (t.first == "0.bias") t.second = torch::full({4}, 1e300, torch::kFloat64);
    return true;
  });
  expect_data_error(read, {refused + "tensor '0.bias' holds a value of F64 beyond F32's range " +
                           "(it would be an infinity); not read"});
  write([](auto& t) {
    if (t.first == "0.bias") t.second = t.second.to(torch::kInt64);
    return true;
  });
  expect_data_error(read, {refused + "tensor '0.bias' is I64[4], the width-4 model's is F32[4] " +
                           "(a floating-point tensor converts, an integer one does not); not read"});
  write([](auto& t) { return t.first.find("running_var") == std::string::npos; });
  expect_data_error(read, {refused + "has no tensor '1.running_var' of the width-4 model (nor 16 " +
                           "more) (save the whole state_dict, buffers included: " +
                           "model.state_dict(), not named_parameters()); not read"});
  write([](auto& t) {
    t.first = "module." + t.first;
    return true;
  });
  expect_data_error(read, {refused + "has no tensor '0.weight' (the stem convolution of the " +
                           "book's ResNet-18 as dptrain and tests/support/pytorch_resnet.py name " +
                           "it) (a DataParallel or DDP wrapper's prefix 'module.': save " +
                           "model.module.state_dict())"});
  write([](auto& t) {
    if (t.first == "1.weight") t.first = "1.\x1b[2Jweight";
    return true;
  });
  expect_data_error(read, {refused + "holds tensor '1.\\x1b[2Jweight', which the width-4 model has " +
                           "not (save the state_dict of tests/support/pytorch_resnet.py's " +
                           "resnet18 of that width); not read"});
}

TEST(CheckpointFormat, PartialSumsAndSecondsNoRunCanHaveAreRefused) {
  const auto refused = [](const char* what, const std::function<void(Checkpoint&)>& edit,
                          const PayloadEdit& payload_edit, const std::string& phrase) {
    SCOPED_TRACE(what);
    for (const auto& [version, bytes] : edited_in_both_versions(edit, payload_edit)) {
      SCOPED_TRACE("version " + std::to_string(version));
      expect_data_error([&, &bytes = bytes] { parse_checkpoint(bytes, "edited"); },
                        {"edited: corrupt: impossible contents: " + phrase});
    }
  };
  using Bytes = std::vector<uint8_t>;
  // small_checkpoint: step 3 of 8, batches of 32, so at most 96 examples so far.
  refused("97 examples after 3 steps", [](Checkpoint& c) { c.partial_sums.count = 97; },
          [](Bytes& p) { put_f64(p, kSums + 16, 97); },
          "the epoch's example count is 97 (a whole number of at most 96: 3 steps of batches of "
          "32 into the epoch)");
  refused("half an example", [](Checkpoint& c) { c.partial_sums.count = 95.5; },
          [](Bytes& p) { put_f64(p, kSums + 16, 95.5); }, "the epoch's example count is 95.5");
  refused("half a correct one", [](Checkpoint& c) { c.partial_sums.correct = 39.5; },
          [](Bytes& p) { put_f64(p, kSums + 8, 39.5); },
          "the epoch's correct count is 39.5 (a whole number)");
  refused("a loss over no examples",
          [](Checkpoint& c) {
            c.step_in_epoch = 0;
            c.global_step = 8;
            c.partial_sums = {2.5, 0, 0};
          },
          [](Bytes& p) {
            put_u64(p, kPosition + 8, 0);
            put_u64(p, kPosition + 16, 8);
            put_f64(p, kSums, 2.5);
            put_f64(p, kSums + 8, 0);
            put_f64(p, kSums + 16, 0);
          },
          "the epoch's loss sum is 2.5 (over no examples: 0)");
  refused("1e300 s into the epoch", [](Checkpoint& c) { c.partial_seconds = 1e300; },
          [](Bytes& p) { put_f64(p, kSeconds, 1e300); },
          "the epoch's seconds is 1e+300 (at most 1000000000");
  refused("an epoch of 1e300 s", [](Checkpoint& c) { c.history[0].seconds = 1e300; },
          [](Bytes& p) { put_f64(p, kHistory + 6 * 8, 1e300); },
          "epoch 1 of the history: seconds is 1e+300");
  refused("1e300 images a second", [](Checkpoint& c) { c.history[0].images_per_second = 1e300; },
          [](Bytes& p) { put_f64(p, kHistory + 7 * 8, 1e300); },
          "epoch 1 of the history: images per second is 1e+300");
  refused("9 steps of an 8-step epoch", [](Checkpoint& c) { c.history[0].steps = 9; },
          [](Bytes& p) { put_u64(p, kHistory + 8 * 8, 9); },
          "epoch 1 of the history: steps is 9 (an epoch of 256 images in batches of 32 has 8 "
          "steps)");
  // A version 2 or 3 file without its training set's digest passed for version 1 (which has
  // none) and skipped the comparison on resume.
  refused("an emptied digest", [](Checkpoint& c) { c.config.train_digest.clear(); },
          [](Bytes& p) { put_digest(p, ""); },
          "the training set's digest is '' (a file of format version");
  refused("a digest of another form", [](Checkpoint& c) { c.config.train_digest = "\x1b[0m"; },
          [](Bytes& p) { put_digest(p, "\x1b[0m"); }, "the training set's digest is '\\x1b[0m'");
  // Version 1 has none, and is still read.
  EXPECT_EQ(parse_checkpoint(legacy_fixture("small-v1.dpt"), "v1").format_version, 1u);
}

// Non-finite weights or a negative running variance resumed, and failed later with advice about
// --lr; no run saves them.
TEST(CheckpointFormat, WeightsNoRunCanHaveAreRefusedNamingTheTensor) {
  TempDir dir;
  // The version 2 file: small-v2.dpt edited, or a fixture holding the same tensor.
  const auto refused = [&](const char* what, const std::function<void(Checkpoint&)>& edit,
                           const std::vector<uint8_t>& legacy_file, const std::string& phrase) {
    SCOPED_TRACE(what);
    auto c = small_checkpoint();
    edit(c);
    for (const auto& [version, bytes] : {std::pair{kCheckpointFormatVersion,
                                                   serialize_checkpoint(c)},
                                         std::pair{2u, legacy_file}}) {
      const std::string path = dir.file(version == 2 ? "c.dpt" : "c.safetensors");
      write_bytes(path, bytes);
      expect_data_error([&] { read_checkpoint(path); },
                        {"checkpoint " + path + ": corrupt: impossible contents: " + phrase});
    }
  };
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  using Bytes = std::vector<uint8_t>;
  const float nan32 = std::numeric_limits<float>::quiet_NaN();
  const float inf32 = std::numeric_limits<float>::infinity();
  refused("a NaN weight", [&](Checkpoint& c) { c.tensors[0].second[1] = nan; },
          legacy_edited([&](Bytes& p) { put_f32(p, kFirstData + 4, nan32); }),
          "tensor 'w' holds NaN or an infinity");
  refused("an infinite weight", [&](Checkpoint& c) { c.tensors[0].second[2] = -inf; },
          legacy_edited([&](Bytes& p) { put_f32(p, kFirstData + 8, -inf32); }),
          "tensor 'w' holds NaN or an infinity");
  refused("a bfloat16 NaN",
          [&](Checkpoint& c) {
            c.tensors.emplace_back("b", torch::full({3}, nan, torch::kBFloat16));
          },
          legacy_fixture("small-v2-bf16-nan.dpt"), "tensor 'b' holds NaN");
  refused("a negative running variance",
          [](Checkpoint& c) {
            c.tensors.emplace_back("1.running_var", torch::tensor({1.0f, -0.5f}));
          },
          legacy_fixture("small-v2-negative-running-var.dpt"),
          "tensor '1.running_var' (a BatchNorm running variance) holds -0.5 (a variance is >= 0)");
  // A running mean may be negative; an integer tensor is left alone.
  auto fine = small_checkpoint();
  fine.tensors.emplace_back("1.running_mean", torch::tensor({-1.0f}));
  EXPECT_EQ(parse_checkpoint(serialize_checkpoint(fine), "fine").tensors.size(), 3u);
}

// ---- Figures no run produces, metadata that contradicts the run state ---------------------

// A history claiming -5 TFLOP/s, an MFU of 1e300 or a peak of -1 bytes must not be resumed and
// its figures republished in the new run's metrics. Every figure has the range a run gives it.
TEST(CheckpointFormat, EfficiencyFiguresNoRunCanProduceAreRefused) {
  const auto refused = [](const char* what, const std::function<void(EpochStats&)>& edit,
                          const std::string& phrase) {
    SCOPED_TRACE(what);
    auto c = small_checkpoint();  // world size 2: at most 2 x 10^5 TFLOP/s
    edit(c.history[0]);
    expect_data_error([&] { parse_checkpoint(serialize_checkpoint(c), "edited"); },
                      {"edited: corrupt: impossible contents: epoch 1 of the history: " + phrase});
  };
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  refused("-5 TFLOP/s", [](EpochStats& s) { s.tflops = -5; },
          "TFLOP/s is -5 (nan, or from 0 to 200000: 100000 a device, in a world of 2)");
  refused("1e300 TFLOP/s", [](EpochStats& s) { s.tflops = 1e300; }, "TFLOP/s is 1e+300");
  refused("an infinite TFLOP/s", [&](EpochStats& s) { s.tflops = inf; }, "TFLOP/s is inf");
  refused("TFLOP/s past 10^5 a device", [](EpochStats& s) { s.tflops = 200001; },
          "TFLOP/s is 200001");
  refused("an MFU of 1e300", [](EpochStats& s) {
    s.tflops = 1;
    s.mfu = 1e300;
  }, "MFU is 1e+300 (nan, or a fraction from 0 to 1)");
  refused("an MFU just above 1", [](EpochStats& s) {
    s.tflops = 1;
    s.mfu = std::nextafter(1.0, 2.0);
  }, "MFU is 1 (nan, or a fraction from 0 to 1)");
  refused("a negative MFU", [](EpochStats& s) {
    s.tflops = 1;
    s.mfu = -0.25;
  }, "MFU is -0.25");
  refused("an MFU of no TFLOP/s", [](EpochStats& s) { s.mfu = 0.5; },
          "MFU is 0.5 (of nan TFLOP/s: nan)");
  refused("a peak of -1 host bytes", [](EpochStats& s) { s.peak_host_bytes = -1; },
          "peak host bytes is -1 (nan, or a whole number of bytes from 0 to 2^50)");
  refused("a peak of 1e300 host bytes", [](EpochStats& s) { s.peak_host_bytes = 1e300; },
          "peak host bytes is 1e+300");
  refused("half a byte", [](EpochStats& s) { s.peak_device_bytes = 1024.5; },
          "peak device bytes is 1024.5");
  refused("a pebibyte and one byte", [](EpochStats& s) { s.peak_device_bytes = 1125899906842625.0; },
          "peak device bytes is 1125899906842625");
  refused("-1 GPU ms a step", [](EpochStats& s) { s.gpu_ms_per_step = -1; },
          "GPU milliseconds per step is -1 (nan, or from 0 to 1000000000000)");
  refused("-inf GPU ms a step", [&](EpochStats& s) { s.gpu_ms_per_step = -inf; },
          "GPU milliseconds per step is -inf");
  refused("an infinite accuracy", [&](EpochStats& s) { s.train_acc = inf; },
          "train accuracy is inf (nan, or an accuracy from 0 to 1)");
  refused("a NaN test accuracy", [&](EpochStats& s) { s.test_acc = nan; },
          "test accuracy is nan (an accuracy from 0 to 1)");
  refused("-1 images a second", [](EpochStats& s) { s.images_per_second = -1; },
          "images per second is -1 (nan, or from 0 to 1000000000000)");
  refused("an infinite speed", [&](EpochStats& s) { s.images_per_second = inf; },
          "images per second is inf");
  refused("a validation accuracy above 1", [](EpochStats& s) { s.val_acc = 1.5; },
          "validation accuracy is 1.5 (nan, or an accuracy from 0 to 1)");
  refused("a negative validation loss", [](EpochStats& s) { s.val_loss = -0.5; },
          "validation loss is -0.5 (a loss: >= 0, inf or nan)");
  refused("-1 evaluation seconds", [](EpochStats& s) { s.eval_seconds = -1; },
          "evaluation seconds is -1 (nan, or from 0 to 1000000000)");
  // The epoch inside its run, in both formats (version 2 keeps the run's epochs too).
  for (const int64_t epochs : {int64_t{0}, int64_t{-3}, int64_t{1000001}}) {
    const auto run_epochs = [&](std::vector<uint8_t>& p) {
      put_u64(p, kHistory + 8, static_cast<uint64_t>(epochs));
    };
    for (const auto& [version, bytes] : edited_in_both_versions(
             [&](Checkpoint& c) { c.history[0].epochs = epochs; }, run_epochs)) {
      SCOPED_TRACE("version " + std::to_string(version));
      expect_data_error([&, &bytes = bytes] { parse_checkpoint(bytes, "edited"); },
                        {"edited: corrupt: impossible contents: epoch 1 of the history: the run's "
                         "epochs is " + std::to_string(epochs) + " (from its number, 1, to "
                         "1000000)"});
    }
  }
}

// What the writer leaves NaN ("no figure": the CPU's GPU time, an MFU without a peak, an epoch
// whose every step was skipped) reads back as NaN; the figures' edges read back exactly.
TEST(CheckpointFormat, FiguresTheWriterLeavesNanAndTheRangesEdgesAreRead) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const auto no_training = [&](Checkpoint& c) {
    auto& s = c.history[0];
    s.train_loss = s.train_acc = s.images_per_second = nan;
  };
  const auto no_training_payload = [&](std::vector<uint8_t>& p) {
    for (const size_t field : {2, 3, 7}) put_f64(p, kHistory + field * 8, nan);  // loss, acc, img/s
  };
  for (const auto& [version, bytes] : edited_in_both_versions(no_training, no_training_payload)) {
    SCOPED_TRACE("version " + std::to_string(version));
    const auto back = parse_checkpoint(bytes, "none").history[0];
    EXPECT_TRUE(std::isnan(back.train_loss) && std::isnan(back.train_acc) &&
                std::isnan(back.images_per_second));
  }
  auto edges = small_checkpoint();
  auto& s = edges.history[0];
  s.epochs = 1;  // its own number
  s.tflops = 200000;  // 10^5 for each of the 2 devices
  s.mfu = 1;
  s.peak_host_bytes = 1125899906842624.0;  // 2^50
  s.peak_device_bytes = 0;
  s.gpu_ms_per_step = 0;
  s.val_loss = 0.375;
  s.val_acc = 1;
  s.eval_seconds = 0;
  const auto back = parse_checkpoint(serialize_checkpoint(edges), "edges").history[0];
  EXPECT_EQ(back.epochs, 1);
  EXPECT_EQ(back.tflops, 200000);
  EXPECT_EQ(back.mfu, 1);
  EXPECT_EQ(back.peak_host_bytes, 1125899906842624.0);
  EXPECT_EQ(back.peak_device_bytes, 0);
  EXPECT_EQ(back.gpu_ms_per_step, 0);
  EXPECT_EQ(back.val_loss, 0.375);
  EXPECT_EQ(back.val_acc, 1);
  EXPECT_EQ(back.eval_seconds, 0);
  // The defaults (NaN for every efficiency figure, and without a validation set) read back as NaN.
  const auto plain = parse_checkpoint(serialize_checkpoint(small_checkpoint()), "p").history[0];
  for (const double figure : {plain.gpu_ms_per_step, plain.tflops, plain.mfu,
                              plain.peak_host_bytes, plain.peak_device_bytes, plain.val_loss,
                              plain.val_acc, plain.eval_seconds}) {
    EXPECT_TRUE(std::isnan(figure)) << figure;
  }
}

// "dptrain.width" 64 over a width-4 run state, or "dptrain.test_acc" 0.9999, accepted, would
// show false figures in PyPI safetensors' metadata view. Metadata that repeats the run state
// must agree with it (Note [Metadata that repeats the run state agrees with it]).
TEST(CheckpointFormat, MetadataThatContradictsTheRunStateIsRefused) {
  const auto bytes = serialize_checkpoint(small_checkpoint());
  const std::string header = header_of(bytes);
  const auto edited = [&](const std::string& from, const std::string& to) {
    return redigested(with_header(bytes, replaced(header, from, to)));
  };
  const auto refused = [&](const std::string& from, const std::string& to,
                           const std::string& phrase) {
    SCOPED_TRACE(to);
    expect_data_error([&] { parse_checkpoint(edited(from, to), "meta.safetensors"); },
                      {"meta.safetensors: corrupt: metadata " + phrase});
  };
  refused("\"dptrain.width\":\"4\"", "\"dptrain.width\":\"64\"",
          "dptrain.width is \"64\" where the run state gives \"4\"");
  refused("\"dptrain.width\":\"4\"", "\"dptrain.width\":\"04\"",
          "dptrain.width is \"04\" where the run state gives \"4\"");
  refused("\"dptrain.num_classes\":\"10\"", "\"dptrain.num_classes\":\"1000\"",
          "dptrain.num_classes is \"1000\" where the run state gives \"10\"");
  refused("\"dptrain.in_channels\":\"1\"", "\"dptrain.in_channels\":\"3\"",
          "dptrain.in_channels is \"3\"");
  refused("\"dptrain.epochs_done\":\"1\"", "\"dptrain.epochs_done\":\"90\"",
          "dptrain.epochs_done is \"90\" where the run state gives \"1\"");
  refused("\"dptrain.train_digest\":\"dd", "\"dptrain.train_digest\":\"\\u001b[2Jd",
          "dptrain.train_digest is \"\\x1b[2J");
  refused("\"dptrain.test_acc\":\"0.5000000000000001\"", "\"dptrain.test_acc\":\"0.9999\"",
          "dptrain.test_acc is \"0.9999\" where the run state gives \"0.5000000000000001\"");
  refused("\"dptrain.test_acc\":\"0.5000000000000001\"", "\"dptrain.test_acc\":\"0.5\"",
          "dptrain.test_acc is \"0.5\"");
  refused("\"dptrain.test_acc\":\"0.5000000000000001\"",
          "\"dptrain.test_acc\":\" 0.5000000000000001\"", "dptrain.test_acc is \" 0.5");
  // The same accuracy in another JSON spelling says nothing false; a key left out neither.
  for (const std::string same : {"5.000000000000001e-1", "0.50000000000000010"}) {
    EXPECT_NO_THROW(parse_checkpoint(
        edited("\"dptrain.test_acc\":\"0.5000000000000001\"",
               "\"dptrain.test_acc\":\"" + same + "\""), "same"))
        << same;
  }
  EXPECT_NO_THROW(parse_checkpoint(edited("\"dptrain.width\":\"4\",", ""), "no width"));
  // No finished epoch, no last test accuracy.
  auto fresh = small_checkpoint();
  fresh.epochs_done = 0;
  fresh.global_step = 3;
  fresh.history.clear();
  const auto fresh_bytes = serialize_checkpoint(fresh);
  EXPECT_EQ(header_of(fresh_bytes).find("dptrain.test_acc"), std::string::npos);
  expect_data_error(
      [&] {
        parse_checkpoint(redigested(with_header(
                             fresh_bytes, replaced(header_of(fresh_bytes), "\"dptrain.width\"",
                                                   "\"dptrain.test_acc\":\"0.9\",\"dptrain.width\""))),
                         "fresh");
      },
      {"fresh: corrupt: metadata dptrain.test_acc is \"0.9\" where the run state gives none (no "
       "epoch is finished)"});
}

// A width of -4 must not build a model first and say "ResNet options must be positive", naming
// no file, nor 2^63 - 1 blame the machine ("cannot hold a width-9223372036854775807 model"). The
// width a file claims is checked first, and a corrupt file is called corrupt, for every reader.
TEST(CheckpointBound, AWidthNoRunHasIsCorruptBeforeAnyModelOrBoundIsMade) {
  TempDir dir;
  AcceptedModel small_machine = accepted_in_memory(/*model_tensors=*/true);
  small_machine.max_width = 64;
  small_machine.available_bytes = int64_t{1} << 30;
  const AcceptedModel readers[] = {accepted_in_memory(/*model_tensors=*/true), small_machine,
                                   accepted_in_memory(/*model_tensors=*/false)};
  for (const int64_t width : {int64_t{-4}, int64_t{0}, int64_t{4097}, INT64_MAX, INT64_MIN}) {
    SCOPED_TRACE("width " + std::to_string(width));
    const std::string phrase = ": corrupt: impossible contents: width is " +
                               std::to_string(width) + " (dptrain writes 1 to 4096)";
    Checkpoint c = model_checkpoint(1);
    c.config.width = width;
    const std::string path = dir.file("w.safetensors");
    write_bytes(path, serialize_checkpoint(c));
    for (const auto& accepted : readers) {
      expect_data_error([&] { read_checkpoint(path, "checkpoint", accepted); },
                        {"checkpoint " + path + phrase});
      expect_data_error([&] { read_model_weights(path, "--model", accepted); },
                        {"--model " + path + phrase});
    }
    // A run's own width, from the flag or not: the file is corrupt, not another model's.
    expect_data_error([&] { read_checkpoint(path, "checkpoint", accepted_run_model(1)); },
                      {"checkpoint " + path + phrase});
    expect_data_error(
        [&] { read_model_weights(path, "--model", accepted_run_model(1, true)); },
        {"--model " + path + phrase});
    // small-v2.dpt claiming that width: the same words before its tensors are read.
    const std::string old = dir.file("w.dpt");
    write_bytes(old, legacy_edited([&](std::vector<uint8_t>& p) {
                  put_u64(p, 0, static_cast<uint64_t>(width));
                }));
    expect_data_error([&] { read_checkpoint(old, "checkpoint", small_machine); },
                      {"checkpoint " + old + phrase});
  }
}

// Names found in a checkpoint directory reached the terminal raw, escape sequences and all.
TEST(ChooseStart, NamesFoundInTheDirectoryAreEscaped) {
  TempDir dir;
  const std::string junk = dir.file("checkpoint-\x1b[31mred.safetensors");
  write_bytes(junk, {'j', 'u', 'n', 'k'});
  TrainOptions options;
  options.width = 4;
  options.checkpoint_dir = dir.path();
  std::vector<std::string> notices;
  const Notice notice = [&](const std::string& text) { notices.push_back(text); };
  // Without --resume: the directory "already holds" it.
  const auto held = expect_throws<UsageError>([&] { choose_start(options, true, notice); },
                                              {"checkpoint-\\x1b[31mred.safetensors"});
  EXPECT_EQ(held.find('\x1b'), std::string::npos) << held;
  // With it: nothing can be read.
  options.resume = true;
  const auto unreadable = expect_throws<UsageError>([&] { choose_start(options, true, notice); },
                                                    {"checkpoint-\\x1b[31mred.safetensors"});
  EXPECT_EQ(unreadable.find('\x1b'), std::string::npos) << unreadable;
  // Beside a good checkpoint, an older-named one is skipped, and the notice is escaped too.
  ASSERT_EQ(::rename(junk.c_str(), dir.file("checkpoint-\x1b]0;x\x07.dpt").c_str()), 0);
  write_checkpoint_atomically(model_checkpoint(4), dir.file(checkpoint_file_name(1, 3)));
  const auto start = choose_start(options, true, notice);
  ASSERT_TRUE(start.has_value());
  EXPECT_EQ(start->first, dir.file(checkpoint_file_name(1, 3)));
  ASSERT_EQ(notices.size(), 1u);
  EXPECT_NE(notices[0].find("checkpoint-\\x1b]0;x\\x07.dpt"), std::string::npos) << notices[0];
  EXPECT_EQ(notices[0].find('\x1b'), std::string::npos) << notices[0];
}

}  // namespace
