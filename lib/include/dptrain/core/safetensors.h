// safetensors files (huggingface/safetensors): named tensors behind a JSON header, with a map of
// strings beside them, the layout PyTorch, JAX and the Rust and JavaScript tools read, and a
// writer and a strict reader for it that never execute anything. Not here: what dptrain keeps in
// a checkpoint or a model file (train/checkpoint.h).
//
// Layout: u64 little-endian N; N bytes of a UTF-8 JSON object (padded with spaces so that the
// data starts 8-byte aligned); the data. The object maps each tensor's name to {"dtype", "shape",
// "data_offsets": [begin, end]} (offsets from the data's start) and "__metadata__" to a map of
// strings.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace dptrain {

// The longest header a reader accepts (the `N` above), before anything else is read: a
// checkpoint's header holds its tensor table and the run's history, about 25 KB plus 300 bytes an
// epoch.
constexpr uint64_t kMaxSafetensorsHeaderBytes = uint64_t{16} << 20;

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;
using SafetensorsMetadata = std::map<std::string, std::string>;

// One tensor as the header declares it.
struct SafetensorsEntry {
  std::string name;
  torch::ScalarType dtype = torch::kFloat32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte offsets from the data's start
  uint64_t end = 0;
};

// A header, checked: every entry's dtype known and its byte count its shape's, the entries in
// the order of their offsets, which tile the data exactly (no hole, no overlap), and the file as
// long as the header says.
struct SafetensorsHeader {
  uint64_t header_bytes = 0;  // N
  uint64_t data_bytes = 0;
  SafetensorsMetadata metadata;
  std::vector<SafetensorsEntry> entries;
  uint64_t data_offset() const { return 8 + header_bytes; }
};

// Checks `size` bytes of JSON text as every reader of dptrain's files must read them (Note [One
// JSON text, one reading] in safetensors.cpp): one value and then only JSON whitespace, no NUL
// byte, no name twice in one object. Throws DataError "<label>: corrupt: <what> is not valid
// JSON: ..." naming the first fault. parse_safetensors_header calls it on the header; the
// run state's reader (train/checkpoint_run_state.cpp) on the run state.
void check_json_text(const char* text, uint64_t size, const std::string& label,
                     const std::string& what);

// "F32", "BF16", ... for the dtypes a model of dptrain's can hold (F32, F64, I64, BF16, F16);
// other dtypes are refused by the writer (an internal error) and the reader (a DataError).
std::string safetensors_dtype_name(torch::ScalarType dtype);

// The file: the header (tensors in the order given) and the data. The tensors may live on any
// device and in any layout; they are written as contiguous CPU tensors.
std::vector<uint8_t> serialize_safetensors(const NamedTensors& tensors,
                                           const SafetensorsMetadata& metadata);

// N from a file's first 8 bytes, checked against the file's size and kMaxSafetensorsHeaderBytes,
// so that a header is read (and allocated for) only when it can be one. Throws DataError
// "<label>: ...". `first` holds min(8, file_size) bytes.
uint64_t safetensors_header_bytes(const uint8_t* first, uint64_t file_size,
                                  const std::string& label);

// Parses and checks the N bytes of JSON that follow the length, for a file of `file_size` bytes.
// Throws DataError "<label>: ..." naming the first fault (JSON that check_json_text refuses, an
// unknown dtype, a shape and a byte count that disagree, a hole between two tensors, the data
// longer or shorter than the offsets, a metadata value that is no string, ...).
SafetensorsHeader parse_safetensors_header(const uint8_t* json, uint64_t size, uint64_t file_size,
                                           const std::string& label);

// The tensors of a checked header from its data (header.data_bytes bytes), as CPU tensors of
// their own, in the header's order.
NamedTensors safetensors_tensors(const SafetensorsHeader& header, const uint8_t* data);

// A whole file in memory: the header, then the tensors. DataError as above.
std::pair<SafetensorsHeader, NamedTensors> parse_safetensors(const std::vector<uint8_t>& bytes,
                                                             const std::string& label);

}  // namespace dptrain
