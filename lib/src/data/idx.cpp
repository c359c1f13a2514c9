// IDX reading and validation; see idx.h for the format.
#include "dptrain/data/idx.h"

#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <ios>
#include <limits>
#include <new>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "dptrain/core/errors.h"
#include "dptrain/core/files.h"

namespace dptrain {
namespace {

constexpr uint8_t kUnsignedByte = 0x08;  // the only element type (Fashion-)MNIST uses
constexpr int kMaxDims = 8;              // IDX allows up to 255; anything past a few is corrupt

std::string describe_type(uint8_t type) {
  switch (type) {
    case 0x08:
      return "0x08 (unsigned byte)";
    case 0x09:
      return "0x09 (signed byte)";
    case 0x0B:
      return "0x0B (short)";
    case 0x0C:
      return "0x0C (int)";
    case 0x0D:
      return "0x0D (float)";
    case 0x0E:
      return "0x0E (double)";
    default: {
      std::ostringstream out;
      out << "0x" << std::hex << static_cast<int>(type) << " (unknown)";
      return out.str();
    }
  }
}

bool is_gzip(const std::vector<uint8_t>& bytes) {
  return bytes.size() >= 2 && bytes[0] == 0x1f && bytes[1] == 0x8b;
}

uint32_t read_big_endian_u32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

// The most data one IDX file may declare: 4 GiB, some 90 times Fashion-MNIST's training images
// (47 MB). Checked before anything of that size is allocated.
constexpr uint64_t kMaxDataBytes = uint64_t{4} << 30;
// The longest header: magic, type, count, then kMaxDims sizes.
constexpr size_t kMaxHeaderBytes = 4 + 4 * kMaxDims;

std::string sizes_text(const std::vector<int64_t>& dims) {
  std::string text;
  for (size_t d = 0; d < dims.size(); ++d) text += (d ? " x " : "") + std::to_string(dims[d]);
  return text;
}

// What a header says, checked: the magic, the element type, the number of dimensions and the
// sizes, whose product must be data dptrain can hold.
struct IdxHeader {
  std::vector<int64_t> dims;
  size_t header_bytes = 0;
  uint64_t data_bytes = 0;
};

IdxHeader read_header(const uint8_t* bytes, size_t size, const std::string& name) {
  if (size < 4) {
    throw DataError(name + ": too short for an IDX header (" + std::to_string(size) + " bytes)");
  }
  if (bytes[0] != 0 || bytes[1] != 0) {
    std::ostringstream out;
    out << name << ": bad magic number: the first two bytes are 0x" << std::hex
        << static_cast<int>(bytes[0]) << " 0x" << static_cast<int>(bytes[1])
        << ", expected 0x0 0x0 (is this an IDX file?)";
    throw DataError(out.str());
  }
  if (bytes[2] != kUnsignedByte) {
    throw DataError(name + ": element type " + describe_type(bytes[2]) +
                    " is not supported, expected " + describe_type(kUnsignedByte));
  }
  const int num_dims = bytes[3];
  if (num_dims < 1 || num_dims > kMaxDims) {
    throw DataError(name + ": " + std::to_string(num_dims) + " dimensions, expected 1 to " +
                    std::to_string(kMaxDims));
  }
  IdxHeader header;
  header.header_bytes = 4 + 4 * static_cast<size_t>(num_dims);
  if (size < header.header_bytes) {
    throw DataError(name + ": truncated header: " + std::to_string(num_dims) + " dimensions need " +
                    std::to_string(header.header_bytes) + " bytes, the file has " +
                    std::to_string(size));
  }
  uint64_t product = 1;
  bool too_large = false;
  for (int d = 0; d < num_dims; ++d) {
    const uint32_t dim = read_big_endian_u32(bytes + 4 + 4 * d);
    header.dims.push_back(dim);
    // Checked before multiplying: the product of eight 32-bit sizes can wrap around 64 bits
    // (2^20 x 2^20 x 2^24 is 0 mod 2^64) and would then match a header-only file.
    if (dim != 0 && product > kMaxDataBytes / dim) too_large = true;
    if (!too_large) product *= dim;
  }
  if (too_large) {
    throw DataError(name + ": sizes in the header are absurdly large: (" + sizes_text(header.dims) +
                    ") is more than the " + std::to_string(kMaxDataBytes >> 30) +
                    " GiB of data dptrain reads from one file");
  }
  header.data_bytes = product;
  return header;
}

// Inflates a gzip file (one member or several in a row) into a buffer, a bounded piece at a
// time, so that the caller decides how much to take before anything large is allocated.
class GzipReader {
 public:
  GzipReader(const std::vector<uint8_t>& compressed, std::string path) : path_(std::move(path)) {
    // 16 + MAX_WBITS: expect a gzip wrapper (not raw zlib).
    if (inflateInit2(&stream_, 16 + MAX_WBITS) != Z_OK) {
      throw DataError(path_ + ": cannot initialise zlib");
    }
    stream_.next_in = const_cast<Bytef*>(compressed.data());
    stream_.avail_in = static_cast<uInt>(compressed.size());
  }
  ~GzipReader() { inflateEnd(&stream_); }
  GzipReader(const GzipReader&) = delete;
  GzipReader& operator=(const GzipReader&) = delete;

  // Inflates into out[produced, out.size()) until it is full or the input ends; returns the new
  // number of bytes in `out`.
  size_t fill(std::vector<uint8_t>& out, size_t produced) {
    while (produced < out.size() && !finished_) {
      stream_.next_out = out.data() + produced;
      stream_.avail_out = static_cast<uInt>(
          std::min<size_t>(out.size() - produced, std::numeric_limits<uInt>::max()));
      const int status = inflate(&stream_, Z_NO_FLUSH);
      produced = static_cast<size_t>(stream_.next_out - out.data());
      if (status == Z_STREAM_END) {
        if (stream_.avail_in == 0) {
          finished_ = true;
          break;
        }
        // Several gzip members in a row (what `cat a.gz b.gz` makes) are one stream to gzip;
        // anything else after the end is not ours to ignore.
        if (stream_.avail_in >= 2 && stream_.next_in[0] == 0x1f && stream_.next_in[1] == 0x8b) {
          inflateReset(&stream_);
          continue;
        }
        throw DataError(path_ + ": " + std::to_string(stream_.avail_in) +
                        " trailing bytes after the gzip stream");
      }
      if (status == Z_BUF_ERROR && stream_.avail_in == 0) {
        throw DataError(path_ + ": gzip data is truncated");
      }
      if (status != Z_OK && status != Z_BUF_ERROR) {
        throw DataError(path_ + ": corrupt gzip data: " +
                        (stream_.msg ? stream_.msg : "zlib error " + std::to_string(status)));
      }
    }
    return produced;
  }

  bool finished() const { return finished_; }

 private:
  std::string path_;
  z_stream stream_{};
  bool finished_ = false;
};

// Note [Unpacking no more than the header declares]
// A small .gz can unpack to any size (10 GiB of zeros fit in 10 MB), so the header is unpacked
// first and checked (read_header refuses more than kMaxDataBytes), and then at most the data it
// declares, plus one byte to notice more, is unpacked.
std::vector<uint8_t> gunzip_idx(const std::vector<uint8_t>& compressed, const std::string& path) {
  GzipReader reader(compressed, path);
  std::vector<uint8_t> out(kMaxHeaderBytes);
  size_t produced = reader.fill(out, 0);
  if (reader.finished()) {  // all of it fits in the header's room: parse_idx judges it
    out.resize(produced);
    return out;
  }
  const IdxHeader header = read_header(out.data(), produced, path);
  const uint64_t declared = header.header_bytes + header.data_bytes;
  // The buffer grows with what arrives, never past the declared size: a header that declares
  // 4 GiB in front of a few bytes allocates a few bytes.
  const size_t limit = static_cast<size_t>(declared) + 1;
  while (!reader.finished() && produced < limit) {
    out.resize(std::min(limit, std::max(out.size() * 2, size_t{1} << 20)));
    produced = reader.fill(out, produced);
  }
  if (produced > declared) {
    throw DataError(path + ": more data than its header declares: (" + sizes_text(header.dims) +
                    ") need " + std::to_string(header.data_bytes) +
                    " bytes of data, and the gzip stream holds more");
  }
  out.resize(produced);
  return out;
}

// A file larger than any IDX file dptrain reads is refused before it is read.
void check_file_size(const std::string& path) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0 || !S_ISREG(info.st_mode)) return;  // the reader says why
  if (static_cast<uint64_t>(info.st_size) > kMaxDataBytes + kMaxHeaderBytes) {
    throw DataError(path + ": " + std::to_string(info.st_size) +
                    " bytes, more than any IDX file dptrain reads (" +
                    std::to_string(kMaxDataBytes >> 30) + " GiB of data)");
  }
}

}  // namespace

IdxArray parse_idx(const std::vector<uint8_t>& bytes, const std::string& name) {
  const IdxHeader header = read_header(bytes.data(), bytes.size(), name);
  const uint64_t actual = bytes.size() - header.header_bytes;
  if (actual != header.data_bytes) {
    std::ostringstream out;
    out << name << ": the header's sizes (" << sizes_text(header.dims) << ") need "
        << header.data_bytes << " bytes of data, the file has " << actual
        << (actual < header.data_bytes ? " (truncated)" : " (trailing bytes)");
    throw DataError(out.str());
  }
  IdxArray array;
  array.dims = header.dims;
  array.data.assign(bytes.begin() + static_cast<std::ptrdiff_t>(header.header_bytes), bytes.end());
  return array;
}

IdxArray read_idx_file(const std::string& path) {
  check_file_size(path);
  try {
    auto bytes = read_regular_file(path, "");
    if (is_gzip(bytes)) bytes = gunzip_idx(bytes, path);
    return parse_idx(bytes, path);
  } catch (const std::bad_alloc&) {
    // A bare "std::bad_alloc" (under ulimit -v, or a full host) would name neither the phase
    // nor the file.
    throw DataError(path + ": out of memory while loading the data set from it (it is read " +
                    "whole, and a .gz file unpacked beside it); free memory, or raise the " +
                    "process's limit (ulimit -v), and run again");
  }
}

}  // namespace dptrain
