// Tests of the IDX reader (idx.h) on small files written here: gzip and plain files give the same
// arrays, and every kind of corrupt or missing file is a DataError naming the file and the fault.
// Suites: IdxReader (well-formed input), IdxCorruption (one parameterised case per fault).

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "dptrain/data/idx.h"
#include "dptrain/core/errors.h"
#include "support/test_support.h"

namespace {

using namespace dptrain;
using dptrain::testing::expect_data_error;
using dptrain::testing::gzip_bytes;
using dptrain::testing::gzip_then_zeros;
using dptrain::testing::make_idx;
using dptrain::testing::TempDir;
using dptrain::testing::write_bytes;

constexpr uint8_t kUByte = 0x08;

std::vector<uint8_t> iota_bytes(size_t count, uint8_t step = 1) {
  std::vector<uint8_t> bytes(count);
  for (size_t i = 0; i < count; ++i) bytes[i] = static_cast<uint8_t>(i * step);
  return bytes;
}

TEST(IdxReader, PlainFileGivesExactDimsAndBytes) {
  TempDir dir;
  const auto data = iota_bytes(24, 11);
  write_bytes(dir.file("a.idx"), make_idx(kUByte, {2, 3, 4}, data));
  const IdxArray array = read_idx_file(dir.file("a.idx"));
  EXPECT_EQ(array.dims, (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(array.data, data);
}

TEST(IdxReader, GzipAndPlainGiveIdenticalArrays) {
  TempDir dir;
  const auto data = iota_bytes(3 * 28 * 28, 7);
  const auto file = make_idx(kUByte, {3, 28, 28}, data);
  write_bytes(dir.file("plain"), file);
  write_bytes(dir.file("packed.gz"), gzip_bytes(file));
  const IdxArray plain = read_idx_file(dir.file("plain"));
  const IdxArray packed = read_idx_file(dir.file("packed.gz"));
  EXPECT_EQ(plain.dims, (std::vector<int64_t>{3, 28, 28}));
  EXPECT_EQ(packed.dims, plain.dims);
  EXPECT_EQ(plain.data, data);
  EXPECT_EQ(packed.data, plain.data);
}

TEST(IdxReader, GzipIsRecognisedByContentNotByName) {
  TempDir dir;
  const std::vector<uint8_t> labels{9, 0, 0, 3, 0};
  const auto file = make_idx(kUByte, {5}, labels);
  write_bytes(dir.file("looks-plain"), gzip_bytes(file));  // gzip without ".gz"
  write_bytes(dir.file("looks-packed.gz"), file);          // plain with ".gz"
  EXPECT_EQ(read_idx_file(dir.file("looks-plain")).data, labels);
  EXPECT_EQ(read_idx_file(dir.file("looks-packed.gz")).data, labels);
  EXPECT_EQ(read_idx_file(dir.file("looks-plain")).dims, (std::vector<int64_t>{5}));
}

TEST(IdxReader, LargeGzipOutgrowsTheInitialBuffer) {
  // Very compressible data: the unpacked size is hundreds of times the packed size, so the
  // output buffer has to grow several times.
  TempDir dir;
  std::vector<uint8_t> data(200000);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i % 5 == 0 ? 1 : 0);
  const auto packed = gzip_bytes(make_idx(kUByte, {200000}, data));
  ASSERT_LT(packed.size() * 4 + 1024, data.size());
  write_bytes(dir.file("big.gz"), packed);
  const IdxArray array = read_idx_file(dir.file("big.gz"));
  EXPECT_EQ(array.dims, (std::vector<int64_t>{200000}));
  EXPECT_EQ(array.data, data);
}

// RFC 1952 allows a gzip file of several members (`cat a.gz b.gz`); gunzip and zcat read them
// as one stream, so must we.
TEST(IdxReader, ConcatenatedGzipMembersAreReadWhole) {
  TempDir dir;
  const auto data = iota_bytes(2 * 28 * 28, 13);
  const auto file = make_idx(kUByte, {2, 28, 28}, data);
  const size_t cut = 100;
  auto packed = gzip_bytes(std::vector<uint8_t>(file.begin(), file.begin() + cut));
  const auto second = gzip_bytes(std::vector<uint8_t>(file.begin() + cut, file.end()));
  packed.insert(packed.end(), second.begin(), second.end());
  write_bytes(dir.file("two-members.gz"), packed);
  try {
    const IdxArray array = read_idx_file(dir.file("two-members.gz"));
    EXPECT_EQ(array.dims, (std::vector<int64_t>{2, 28, 28}));
    EXPECT_EQ(array.data, data);
  } catch (const DataError& error) {
    ADD_FAILURE() << "a valid two-member gzip file was rejected: " << error.what();
  }
}

// Bytes after the end of the gzip stream that are not another member are corruption, not
// something to drop silently.
TEST(IdxReader, GarbageAfterTheGzipStreamIsDataError) {
  TempDir dir;
  auto packed = gzip_bytes(make_idx(kUByte, {3}, {1, 2, 3}));
  packed.insert(packed.end(), {'j', 'u', 'n', 'k', 0, 0, 0, 0});
  const std::string path = dir.file("junk-after.gz");
  write_bytes(path, packed);
  expect_data_error([&] { read_idx_file(path); }, {path});
}

// What read_idx_file(path) cost, run in a child process of its own (fork): the child's
// high-water mark of resident memory starts at what it holds when forked, so the growth is this
// read's alone, whatever the test binary held before.
struct ChildRead {
  int64_t peak_growth_kib = -1;  // how far resident memory rose above the start
  std::string error;             // the DataError's message, or what else happened
};

ChildRead read_idx_in_child(const std::string& path) {
  int pipe_ends[2];
  if (::pipe(pipe_ends) != 0) return {-1, "pipe failed"};
  const pid_t pid = ::fork();
  if (pid < 0) return {-1, "fork failed"};
  if (pid == 0) {
    ::close(pipe_ends[0]);
    const auto peak_kib = [] {
      rusage usage{};
      ::getrusage(RUSAGE_SELF, &usage);
      return static_cast<int64_t>(usage.ru_maxrss);
    };
    const int64_t start = peak_kib();
    std::string error = "no exception";
    try {
      read_idx_file(path);
    } catch (const DataError& e) {
      error = e.what();
    } catch (const std::exception& e) {
      error = std::string("not a DataError: ") + e.what();
    }
    const std::string report = std::to_string(peak_kib() - start) + "\n" + error;
    const ssize_t written = ::write(pipe_ends[1], report.data(), report.size());
    ::_exit(written == static_cast<ssize_t>(report.size()) ? 0 : 1);
  }
  ::close(pipe_ends[1]);
  std::string report;
  char buffer[4096];
  for (ssize_t n; (n = ::read(pipe_ends[0], buffer, sizeof buffer)) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    report.append(buffer, static_cast<size_t>(n));
  }
  ::close(pipe_ends[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  const size_t newline = report.find('\n');
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || newline == std::string::npos) {
    return {-1, "the child ended with status " + std::to_string(status) + ": " + report};
  }
  return {std::stoll(report.substr(0, newline)), report.substr(newline + 1)};
}

// A gzip bomb: 16 images declared, 512 MiB of zeros behind them in half a megabyte. Unpacking
// the whole stream would hold it all (10 GiB of zeros end in std::bad_alloc); the reader
// stops one byte past what the header declares, so reading it costs a few pages: the
// bound is far below the 512 MiB that unpacking it all holds at once.
TEST(IdxReader, GzipBombStopsAtTheDeclaredSize) {
  TempDir dir;
  const std::string path = dir.file("bomb.gz");
  write_bytes(path, gzip_then_zeros(make_idx(kUByte, {16, 28, 28}, {}), size_t{512} << 20));
  const ChildRead read = read_idx_in_child(path);
  EXPECT_NE(read.error.find(path + ": more data than its header declares: (16 x 28 x 28) need "
                                   "12544 bytes"),
            std::string::npos)
      << read.error;
  ASSERT_GE(read.peak_growth_kib, 0) << read.error;
  EXPECT_LT(read.peak_growth_kib, 32 * 1024) << "KiB of resident memory to read a bomb";
}

// A header that declares more than any IDX file dptrain reads (4 GiB of data) is refused before
// anything is unpacked or allocated; one within the limit in front of a few bytes allocates as
// the bytes arrive and is truncated.
TEST(IdxReader, DeclaredSizeIsCheckedBeforeAllocating) {
  TempDir dir;
  const std::string huge = dir.file("huge.gz");
  write_bytes(huge, gzip_then_zeros(make_idx(kUByte, {100000, 100000}, {}), 1000));
  expect_data_error([&] { read_idx_file(huge); },
                    {huge, "absurdly large: (100000 x 100000) is more than the 4 GiB"});
  const std::string large = dir.file("large.gz");
  write_bytes(large, gzip_then_zeros(make_idx(kUByte, {5000000, 28, 28}, {}), 1000));
  expect_data_error([&] { read_idx_file(large); },
                    {large, "need 3920000000 bytes of data, the file has 1000 (truncated)"});
}

// A plain file larger than any IDX file dptrain reads is refused by its size, unread (a sparse
// file: no disk is used).
TEST(IdxReader, PlainFileLargerThanAnyIdxIsRefusedUnread) {
  TempDir dir;
  const std::string path = dir.file("huge.idx");
  write_bytes(path, make_idx(kUByte, {60000, 28, 28}, {}));
  ASSERT_EQ(::truncate(path.c_str(), (int64_t{5} << 30)), 0);
  expect_data_error([&] { read_idx_file(path); },
                    {path, "5368709120 bytes, more than any IDX file dptrain reads"});
}

TEST(IdxReader, ZeroSizedFirstDimensionIsAnEmptyArray) {
  TempDir dir;
  write_bytes(dir.file("empty.gz"), gzip_bytes(make_idx(kUByte, {0, 28, 28}, {})));
  const IdxArray array = read_idx_file(dir.file("empty.gz"));
  EXPECT_EQ(array.dims, (std::vector<int64_t>{0, 28, 28}));
  EXPECT_TRUE(array.data.empty());
}

TEST(IdxReader, SizesAreReadBigEndian) {
  // 0x00000102 = 258 elements: a little-endian reader would see 0x02010000.
  const auto data = iota_bytes(258, 3);
  const IdxArray array = parse_idx(make_idx(kUByte, {258}, data), "in-memory");
  EXPECT_EQ(array.dims, (std::vector<int64_t>{258}));
  EXPECT_EQ(array.data, data);
}

TEST(IdxReader, ParseIdxEqualsReadingTheFile) {
  TempDir dir;
  const auto file = make_idx(kUByte, {4, 2}, iota_bytes(8, 29));
  write_bytes(dir.file("f"), file);
  const IdxArray from_file = read_idx_file(dir.file("f"));
  const IdxArray from_memory = parse_idx(file, "whatever");
  EXPECT_EQ(from_memory.dims, from_file.dims);
  EXPECT_EQ(from_memory.data, from_file.data);
}

TEST(IdxReader, ParseIdxErrorsUseTheGivenName) {
  expect_data_error(
      [] {
        parse_idx({0x12, 0x34, 0x08, 0x01, 0, 0, 0, 0}, "my-buffer");
      },
      {"my-buffer", "bad magic number"});
  expect_data_error([] { parse_idx({}, "empty-buffer"); },
                    {"empty-buffer", "too short for an IDX header (0 bytes)"});
}

TEST(IdxReader, MissingFileIsDataErrorNamingThePath) {
  TempDir dir;
  const std::string path = dir.file("no-such-file.gz");
  expect_data_error([&] { read_idx_file(path); }, {path, "cannot open"});
}

// A path that opens but cannot be read (here EISDIR) is a DataError too, like any other read
// error: the stream's own exception must not escape without the path.
TEST(IdxReader, DirectoryIsDataErrorNamingThePath) {
  TempDir dir;
  const std::string path = dir.file("subdir");
  dptrain::testing::make_directories(path);
  expect_data_error([&] { read_idx_file(path); }, {path});
}

// One kind of corruption: the bytes of the file and phrases its error message must contain
// (besides the file's path).
struct CorruptionCase {
  std::string name;
  std::vector<uint8_t> bytes;
  std::vector<std::string> phrases;
};

std::ostream& operator<<(std::ostream& out, const CorruptionCase& c) { return out << c.name; }

std::vector<uint8_t> truncated(std::vector<uint8_t> bytes, size_t size) {
  bytes.resize(size);
  return bytes;
}

std::vector<uint8_t> with_trailing(std::vector<uint8_t> bytes, std::vector<uint8_t> extra) {
  bytes.insert(bytes.end(), extra.begin(), extra.end());
  return bytes;
}

// A valid gzip stream of a valid IDX file, to be spoilt.
std::vector<uint8_t> good_gzip() { return gzip_bytes(make_idx(kUByte, {6, 28}, iota_bytes(168))); }

std::vector<uint8_t> gzip_with_bad_block_type() {
  auto bytes = good_gzip();
  bytes[10] = 0xFF;  // first deflate block header (after the 10-byte gzip header): BTYPE = 11
  return bytes;
}

std::vector<uint8_t> gzip_with_bad_crc() {
  auto bytes = good_gzip();
  bytes[bytes.size() - 8] ^= 0xFF;  // the CRC-32 of the trailer
  return bytes;
}

std::vector<uint8_t> gzip_with_bad_length() {
  auto bytes = good_gzip();
  bytes[bytes.size() - 4] ^= 0x01;  // ISIZE of the trailer
  return bytes;
}

class IdxCorruption : public ::testing::TestWithParam<CorruptionCase> {};

TEST_P(IdxCorruption, IsDataErrorNamingFileAndFault) {
  TempDir dir;
  const std::string path = dir.file(GetParam().name + ".idx");
  write_bytes(path, GetParam().bytes);
  auto phrases = GetParam().phrases;
  phrases.push_back(path);
  expect_data_error([&] { read_idx_file(path); }, phrases);
}

const std::vector<uint8_t> kSixBytes{1, 2, 3, 4, 5, 6};

INSTANTIATE_TEST_SUITE_P(
    IdxFaults, IdxCorruption,
    ::testing::Values(
        CorruptionCase{"empty_file", {}, {"too short for an IDX header (0 bytes)"}},
        CorruptionCase{"three_bytes", {0, 0, 8}, {"too short for an IDX header (3 bytes)"}},
        CorruptionCase{"bad_magic_both",
                       {0x12, 0x34, 0x08, 0x01, 0, 0, 0, 1, 7},
                       {"bad magic number", "0x12 0x34"}},
        CorruptionCase{"bad_magic_second_byte",
                       {0x00, 0x01, 0x08, 0x01, 0, 0, 0, 1, 7},
                       {"bad magic number", "0x0 0x1"}},
        CorruptionCase{"float_elements",
                       make_idx(0x0D, {2}, {0, 0, 0, 0, 0, 0, 0, 0}),
                       {"element type 0x0D (float) is not supported", "expected 0x08"}},
        CorruptionCase{"signed_byte_elements",
                       make_idx(0x09, {6}, kSixBytes),
                       {"element type 0x09 (signed byte) is not supported"}},
        CorruptionCase{"unknown_element_type",
                       make_idx(0x42, {6}, kSixBytes),
                       {"element type 0x42 (unknown) is not supported"}},
        CorruptionCase{
            "zero_dimensions", make_idx(kUByte, {}, {}), {"0 dimensions, expected 1 to 8"}},
        CorruptionCase{"nine_dimensions",
                       make_idx(kUByte, {1, 1, 1, 1, 1, 1, 1, 1, 1}, {5}),
                       {"9 dimensions, expected 1 to 8"}},
        CorruptionCase{"truncated_header",
                       truncated(make_idx(kUByte, {2, 3}, kSixBytes), 10),
                       {"truncated header", "2 dimensions need 12 bytes, the file has 10"}},
        CorruptionCase{"data_truncated",
                       truncated(make_idx(kUByte, {2, 3}, kSixBytes), 12 + 5),
                       {"(2 x 3) need 6 bytes of data, the file has 5 (truncated)"}},
        CorruptionCase{"header_only",
                       make_idx(kUByte, {60000, 28, 28}, {}),
                       {"need 47040000 bytes of data, the file has 0 (truncated)"}},
        CorruptionCase{"trailing_bytes",
                       with_trailing(make_idx(kUByte, {2, 3}, kSixBytes), {9, 9}),
                       {"need 6 bytes of data, the file has 8 (trailing bytes)"}},
        CorruptionCase{
            "absurd_sizes", make_idx(kUByte, {65536, 65536, 65536}, {}), {"absurdly large"}},
        // Found by fuzz_idx: the product 2^64 wrapped to 0 and the header-only file parsed.
        CorruptionCase{"sizes_whose_product_wraps_to_zero",
                       make_idx(kUByte, {1u << 20, 1u << 20, 1u << 24}, {}),
                       {"absurdly large"}},
        CorruptionCase{"gzip_bad_block_type", gzip_with_bad_block_type(), {"corrupt gzip data"}},
        CorruptionCase{"gzip_bad_crc", gzip_with_bad_crc(), {"corrupt gzip data"}},
        CorruptionCase{"gzip_bad_length", gzip_with_bad_length(), {"corrupt gzip data"}},
        CorruptionCase{"gzip_truncated_in_the_middle",
                       truncated(good_gzip(), good_gzip().size() / 2),
                       {"gzip data is truncated"}},
        CorruptionCase{"gzip_without_trailer",
                       truncated(good_gzip(), good_gzip().size() - 8),
                       {"gzip data is truncated"}},
        CorruptionCase{"gzip_magic_only", {0x1f, 0x8b}, {"gzip data is truncated"}},
        CorruptionCase{"gzip_of_bad_idx",
                       gzip_bytes({0x12, 0x34, 0x08, 0x01, 0, 0, 0, 1, 7}),
                       {"bad magic number"}},
        CorruptionCase{"gzip_more_data_than_declared",
                       gzip_bytes(with_trailing(make_idx(kUByte, {2, 3}, kSixBytes),
                                                std::vector<uint8_t>(100))),
                       {"more data than its header declares: (2 x 3) need 6 bytes"}},
        CorruptionCase{"gzip_of_truncated_idx",
                       gzip_bytes(truncated(make_idx(kUByte, {2, 3}, kSixBytes), 12 + 5)),
                       {"(truncated)"}}),
    [](const ::testing::TestParamInfo<CorruptionCase>& info) { return info.param.name; });

}  // namespace
