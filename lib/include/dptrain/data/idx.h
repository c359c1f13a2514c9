// Reader for the IDX format of (Fashion-)MNIST, gzip-compressed or plain: a big-endian header
// (two zero bytes, an element type, the number of dimensions, one 32-bit size per dimension)
// followed by the elements. Only unsigned bytes (type 0x08) are read; every other kind of
// malformed file is a DataError naming the file and what is wrong.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dptrain {

struct IdxArray {
  std::vector<int64_t> dims;  // e.g. {60000, 28, 28} for images, {60000} for labels
  std::vector<uint8_t> data;  // row-major, product(dims) bytes
};

// Reads `path`; gzip is recognised by its magic bytes, not by the file name.
IdxArray read_idx_file(const std::string& path);

// Parses IDX bytes already in memory; `name` is used in error messages.
IdxArray parse_idx(const std::vector<uint8_t>& bytes, const std::string& name);

}  // namespace dptrain
