// The safetensors writer and its strict reader. See safetensors.h.
//
// Note [Our own safetensors codec]
// LibTorch has no C++ reader or writer for safetensors (pytorch/pytorch#150857), and the Rust
// crate's C bindings are packaged neither by Debian nor by PyPI for C++. The format is small: a
// length, a JSON object and raw bytes, so we parse the JSON with a well-kept library (Debian's
// nlohmann-json3) and keep here only the checks the format's own reader makes (known dtypes,
// offsets that tile the data, a header that is an object of the right shape). Measured against
// PyPI's safetensors: tests/core/test_safetensors.cpp reads a file its save_file wrote
// (tests/fixtures/safetensors), and tests/integration/test_round_trip.py loads ours with its
// load_file; the fuzzer (fuzz/fuzz_checkpoint.cpp) feeds this reader through parse_checkpoint.
#include "dptrain/core/safetensors.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "dptrain/core/errors.h"
#include "dptrain/core/files.h"

namespace dptrain {
namespace {

// The files hold the host's bytes as they are; the format is little-endian, and so is every
// machine dptrain builds for.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors data is little-endian");

constexpr size_t kMaxRank = 8;
constexpr char kMetadataKey[] = "__metadata__";

struct DtypeName {
  torch::ScalarType dtype;
  const char* name;
};
constexpr DtypeName kDtypes[] = {
    {torch::kFloat32, "F32"}, {torch::kFloat64, "F64"}, {torch::kInt64, "I64"},
    {torch::kBFloat16, "BF16"}, {torch::kFloat16, "F16"},
};

[[noreturn]] void fail(const std::string& label, const std::string& what) {
  throw DataError(label + ": " + what);
}

// A value from the header, for a message: a number or a string as JSON writes it (escaped, cut
// at 40 bytes), anything else by its kind. Never dump() an array or object: a crafted header
// nests them a million deep, and dump() recurses once per level.
std::string shown(const nlohmann::json& value) {
  if (value.is_array()) return "an array";
  if (value.is_object()) return "an object";
  std::string text = value.dump();
  if (text.size() > 40) text = text.substr(0, 40) + "...";
  return printable(text);
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? "," : "") + std::to_string(shape[i]);
  return text + "]";
}

// A tensor's entry: {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, nothing else.
SafetensorsEntry parse_entry(const std::string& name, const nlohmann::json& value,
                             uint64_t data_bytes, const std::string& label) {
  const std::string name_shown = "tensor '" + printable(name) + "'";
  if (!value.is_object()) fail(label, name_shown + " is not an object in the header");
  for (const auto& [key, _] : value.items()) {
    if (key != "dtype" && key != "shape" && key != "data_offsets") {
      fail(label, name_shown + " has an unknown field '" + printable(key) + "'");
    }
  }
  SafetensorsEntry entry;
  entry.name = name;
  const auto dtype = value.find("dtype");
  if (dtype == value.end() || !dtype->is_string()) fail(label, name_shown + " has no dtype");
  const auto known = std::find_if(std::begin(kDtypes), std::end(kDtypes), [&](const DtypeName& d) {
    return *dtype == d.name;
  });
  if (known == std::end(kDtypes)) {
    fail(label, name_shown + " has dtype " + shown(*dtype) +
                    "; dptrain reads F32, F64, I64, BF16 and F16");
  }
  entry.dtype = known->dtype;
  const auto shape = value.find("shape");
  if (shape == value.end() || !shape->is_array() || shape->size() > kMaxRank) {
    fail(label, name_shown + " has no shape of rank 0 to " + std::to_string(kMaxRank));
  }
  // The element count, bounded by the data: no product can overflow past it unnoticed.
  const uint64_t element = c10::elementSize(entry.dtype);
  uint64_t numel = 1;
  for (const auto& dim : *shape) {
    if (!dim.is_number_unsigned() || dim.get<uint64_t>() > uint64_t{1} << 62) {
      fail(label, name_shown + " has a bad dimension " + shown(dim));
    }
    const auto size = dim.get<uint64_t>();
    if (size != 0 && numel > data_bytes / element / size) {
      fail(label, name_shown + " has a shape larger than the data (" +
                      std::to_string(data_bytes) + " bytes)");
    }
    numel *= size;
    entry.shape.push_back(static_cast<int64_t>(size));
  }
  const auto offsets = value.find("data_offsets");
  if (offsets == value.end() || !offsets->is_array() || offsets->size() != 2 ||
      !(*offsets)[0].is_number_unsigned() || !(*offsets)[1].is_number_unsigned()) {
    fail(label, name_shown + " has no data_offsets [begin, end]");
  }
  entry.begin = (*offsets)[0].get<uint64_t>();
  entry.end = (*offsets)[1].get<uint64_t>();
  if (entry.end < entry.begin || entry.end - entry.begin != numel * element) {
    fail(label, name_shown + " has data_offsets [" + std::to_string(entry.begin) + ", " +
                    std::to_string(entry.end) + "], its shape " + shape_text(entry.shape) +
                    " of " + dtype->get<std::string>() + " takes " +
                    std::to_string(numel * element) + " bytes");
  }
  return entry;
}

SafetensorsMetadata parse_metadata(const nlohmann::json& value, const std::string& label) {
  if (!value.is_object()) fail(label, "__metadata__ is not an object");
  SafetensorsMetadata metadata;
  for (const auto& [key, text] : value.items()) {
    if (!text.is_string()) {
      fail(label, "__metadata__ '" + printable(key) + "' is not a string");
    }
    metadata.emplace(key, text.get<std::string>());
  }
  return metadata;
}

// Note [One JSON text, one reading]
// A file's JSON (the header, and the run state inside its metadata) must read the same in every
// reader, or a crafted file shows one reader what another never sees. nlohmann's parser, given a
// range, stops at a NUL byte as at the end (a header "{...}\0anything" parsed, and the bytes
// after the NUL were covered by nothing), and keeps the last of a name given twice; PyPI
// safetensors (serde_json) and scripts/read_checkpoint.py (json.loads) refuse a NUL and any byte
// after the value but JSON whitespace, and the script refuses a name given twice. So a JSON text
// is read here as RFC 8259 defines it and the strictest of the three reads it: one value, then
// only whitespace (space, tab, LF, CR: the 0x20 padding of the safetensors specification is
// one), no NUL byte anywhere (inside a string it is written \u0000), and no name twice in one
// object (RFC 8259 leaves a reader free to take either). A SAX pass checks it before the value is
// built: nlohmann's parser callback sees keys but not which object they belong to without a
// stack, and a SAX reader is that stack. docs/checkpoints.md ("A valid file") states the whole
// definition; tests/integration/test_three_readers.py holds the three readers to it.
class JsonTextCheck : public nlohmann::json_sax<nlohmann::json> {
 public:
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override {
    names_.emplace_back();
    return true;
  }
  bool key(string_t& name) override {
    if (names_.back().insert(name).second) return true;
    fault_ = "the name '" + printable(name) + "' appears twice";
    return false;
  }
  bool end_object() override {
    names_.pop_back();
    return true;
  }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    fault_ = printable(e.what());
    return false;
  }
  const std::string& fault() const { return fault_; }

 private:
  std::vector<std::set<std::string>> names_;  // the names seen in each open object, innermost last
  std::string fault_;
};

}  // namespace

void check_json_text(const char* text, uint64_t size, const std::string& label,
                     const std::string& what) {
  const void* nul = std::memchr(text, '\0', static_cast<size_t>(size));
  if (nul != nullptr) {
    fail(label, "corrupt: " + what + " is not valid JSON: a NUL byte at byte " +
                    std::to_string(static_cast<const char*>(nul) - text) + " of " +
                    std::to_string(size));
  }
  JsonTextCheck check;
  if (!nlohmann::json::sax_parse(text, text + size, &check) || !check.fault().empty()) {
    fail(label, "corrupt: " + what + " is not valid JSON: " + check.fault());
  }
}

std::string safetensors_dtype_name(torch::ScalarType dtype) {
  for (const auto& d : kDtypes) {
    if (d.dtype == dtype) return d.name;
  }
  TORCH_CHECK(false, "safetensors: dptrain writes no tensor of dtype ", dtype);
}

std::vector<uint8_t> serialize_safetensors(const NamedTensors& tensors,
                                           const SafetensorsMetadata& metadata) {
  // Insertion order, so that a person reading the header sees the model's order.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header[kMetadataKey] = metadata;
  std::vector<torch::Tensor> contiguous;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    TORCH_CHECK(name != kMetadataKey, "safetensors: a tensor may not be named ", kMetadataKey);
    auto t = tensor.detach().to(torch::kCPU).contiguous();
    const uint64_t bytes = static_cast<uint64_t>(t.numel()) * t.element_size();
    header[name] = {{"dtype", safetensors_dtype_name(t.scalar_type())},
                    {"shape", t.sizes().vec()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    contiguous.push_back(std::move(t));
  }
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');  // the data 8-byte aligned, as safetensors pads
  std::vector<uint8_t> file(8 + json.size() + offset);
  for (int i = 0; i < 8; ++i) file[i] = static_cast<uint8_t>(json.size() >> (8 * i));
  std::memcpy(file.data() + 8, json.data(), json.size());
  uint8_t* data = file.data() + 8 + json.size();
  for (const auto& t : contiguous) {
    const size_t bytes = static_cast<size_t>(t.numel()) * t.element_size();
    if (bytes > 0) std::memcpy(data, t.data_ptr(), bytes);  // an empty tensor has no storage
    data += bytes;
  }
  return file;
}

uint64_t safetensors_header_bytes(const uint8_t* first, uint64_t file_size,
                                  const std::string& label) {
  if (file_size < 8) {
    fail(label, "truncated: " + std::to_string(file_size) +
                    " bytes, shorter than a safetensors file's 8-byte header length");
  }
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(first[i]) << (8 * i);
  if (n > kMaxSafetensorsHeaderBytes) {
    fail(label, "not a safetensors file of dptrain's, or corrupt: its first 8 bytes give a "
                "header of " + std::to_string(n) + " bytes, more than the " +
                    std::to_string(kMaxSafetensorsHeaderBytes) + " dptrain reads");
  }
  if (n < 2 || n > file_size - 8) {
    fail(label, "truncated or corrupt: the header length says " + std::to_string(n) +
                    " bytes, the file has " + std::to_string(file_size - 8) + " after it");
  }
  return n;
}

SafetensorsHeader parse_safetensors_header(const uint8_t* json, uint64_t size, uint64_t file_size,
                                           const std::string& label) {
  if (json[0] != '{') {
    fail(label, "corrupt or not a safetensors file: the header is not a JSON object (it starts "
                "with no '{')");
  }
  const char* text = reinterpret_cast<const char*>(json);
  check_json_text(text, size, label, "the header");
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text, text + size);
  } catch (const nlohmann::json::exception& e) {  // check_json_text parsed it: never here
    fail(label, "corrupt: the header is not valid JSON: " + printable(e.what()));
  }
  if (!header.is_object()) fail(label, "the header is not a JSON object");
  SafetensorsHeader parsed;
  parsed.header_bytes = size;
  parsed.data_bytes = file_size - 8 - size;
  for (const auto& [name, value] : header.items()) {
    if (name == kMetadataKey) {
      parsed.metadata = parse_metadata(value, label);
    } else {
      parsed.entries.push_back(parse_entry(name, value, parsed.data_bytes, label));
    }
  }
  std::sort(parsed.entries.begin(), parsed.entries.end(),
            [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
              return std::tie(a.begin, a.end) < std::tie(b.begin, b.end);
            });
  uint64_t expected = 0;
  for (const auto& entry : parsed.entries) {
    if (entry.begin != expected) {
      fail(label, "tensor '" + printable(entry.name) + "' starts at byte " +
                      std::to_string(entry.begin) + " of the data, where " +
                      std::to_string(expected) + " was expected (a hole or an overlap)");
    }
    expected = entry.end;
  }
  if (expected != parsed.data_bytes) {
    fail(label, "truncated or padded: the tensors take " + std::to_string(expected) +
                    " bytes of data, the file holds " + std::to_string(parsed.data_bytes));
  }
  return parsed;
}

NamedTensors safetensors_tensors(const SafetensorsHeader& header, const uint8_t* data) {
  NamedTensors tensors;
  tensors.reserve(header.entries.size());
  for (const auto& entry : header.entries) {
    auto tensor = torch::empty(entry.shape, torch::TensorOptions().dtype(entry.dtype));
    if (entry.end > entry.begin) std::memcpy(tensor.data_ptr(), data + entry.begin, entry.end - entry.begin);
    tensors.emplace_back(entry.name, std::move(tensor));
  }
  return tensors;
}

std::pair<SafetensorsHeader, NamedTensors> parse_safetensors(const std::vector<uint8_t>& bytes,
                                                             const std::string& label) {
  const uint64_t n = safetensors_header_bytes(bytes.data(), bytes.size(), label);
  auto header = parse_safetensors_header(bytes.data() + 8, n, bytes.size(), label);
  auto tensors = safetensors_tensors(header, bytes.data() + header.data_offset());
  return {std::move(header), std::move(tensors)};
}

}  // namespace dptrain
