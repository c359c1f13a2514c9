// IDX reading and validation; see idx.h for the format.
#include "dptrain/idx.h"

#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>

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

std::vector<uint8_t> read_file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(path + ": cannot open: " + std::strerror(errno));
  try {
    std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                               std::istreambuf_iterator<char>());
    if (in.bad()) throw DataError(path + ": read error");
    return bytes;
  } catch (const std::ios_base::failure& e) {
    // libstdc++ reports a failed read(2) (a directory, an I/O error) by throwing.
    throw DataError(path + ": read error: " + e.what());
  }
}

bool is_gzip(const std::vector<uint8_t>& bytes) {
  return bytes.size() >= 2 && bytes[0] == 0x1f && bytes[1] == 0x8b;
}

std::vector<uint8_t> gunzip(const std::vector<uint8_t>& compressed, const std::string& path) {
  z_stream stream{};
  // 16 + MAX_WBITS: expect a gzip wrapper (not raw zlib).
  if (inflateInit2(&stream, 16 + MAX_WBITS) != Z_OK) {
    throw DataError(path + ": cannot initialise zlib");
  }
  std::vector<uint8_t> out(compressed.size() * 4 + 1024);
  stream.next_in = const_cast<Bytef*>(compressed.data());
  stream.avail_in = static_cast<uInt>(compressed.size());
  const auto fail = [&](const std::string& reason) {
    inflateEnd(&stream);
    throw DataError(path + ": " + reason);
  };
  size_t produced = 0;  // not stream.total_out, which inflateReset clears between members
  while (true) {
    if (produced == out.size()) out.resize(out.size() * 2);
    stream.next_out = out.data() + produced;
    stream.avail_out = static_cast<uInt>(out.size() - produced);
    const int status = inflate(&stream, Z_NO_FLUSH);
    produced = static_cast<size_t>(stream.next_out - out.data());
    if (status == Z_STREAM_END) {
      if (stream.avail_in == 0) break;
      // Several gzip members in a row (what `cat a.gz b.gz` makes) are one stream to gzip;
      // anything else after the end is not ours to ignore.
      if (stream.avail_in >= 2 && stream.next_in[0] == 0x1f && stream.next_in[1] == 0x8b) {
        inflateReset(&stream);
        continue;
      }
      fail(std::to_string(stream.avail_in) + " trailing bytes after the gzip stream");
    }
    if (status == Z_BUF_ERROR && stream.avail_in == 0) fail("gzip data is truncated");
    if (status != Z_OK && status != Z_BUF_ERROR) {
      fail(std::string("corrupt gzip data: ") +
           (stream.msg ? stream.msg : "zlib error " + std::to_string(status)));
    }
  }
  out.resize(produced);
  inflateEnd(&stream);
  return out;
}

uint32_t read_big_endian_u32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

}  // namespace

IdxArray parse_idx(const std::vector<uint8_t>& bytes, const std::string& name) {
  if (bytes.size() < 4) {
    throw DataError(name + ": too short for an IDX header (" + std::to_string(bytes.size()) +
                    " bytes)");
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
  const size_t header = 4 + 4 * static_cast<size_t>(num_dims);
  if (bytes.size() < header) {
    throw DataError(name + ": truncated header: " + std::to_string(num_dims) + " dimensions need " +
                    std::to_string(header) + " bytes, the file has " +
                    std::to_string(bytes.size()));
  }
  IdxArray array;
  constexpr uint64_t kMaxBytes = uint64_t{1} << 40;  // 1 TiB: no real data set comes near
  uint64_t expected = 1;
  for (int d = 0; d < num_dims; ++d) {
    const uint32_t size = read_big_endian_u32(bytes.data() + 4 + 4 * d);
    array.dims.push_back(size);
    // Checked before multiplying: the product of eight 32-bit sizes can wrap around 64 bits
    // (2^20 x 2^20 x 2^24 is 0 mod 2^64) and would then match a header-only file.
    if (size != 0 && expected > kMaxBytes / size) {
      throw DataError(name + ": sizes in the header are absurdly large");
    }
    expected *= size;
  }
  const uint64_t actual = bytes.size() - header;
  if (actual != expected) {
    std::ostringstream out;
    out << name << ": the header's sizes (";
    for (size_t d = 0; d < array.dims.size(); ++d) out << (d ? " x " : "") << array.dims[d];
    out << ") need " << expected << " bytes of data, the file has " << actual
        << (actual < expected ? " (truncated)" : " (trailing bytes)");
    throw DataError(out.str());
  }
  array.data.assign(bytes.begin() + static_cast<std::ptrdiff_t>(header), bytes.end());
  return array;
}

IdxArray read_idx_file(const std::string& path) {
  auto bytes = read_file_bytes(path);
  if (is_gzip(bytes)) bytes = gunzip(bytes, path);
  return parse_idx(bytes, path);
}

}  // namespace dptrain
