// core/safetensors.h: the writer's layout byte for byte, a file PyPI's safetensors wrote read
// exactly, and every header fault named. Checkpoints on top of it: tests/train/test_checkpoint.cpp.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "dptrain/core/files.h"
#include "dptrain/core/safetensors.h"
#include "support/test_support.h"

namespace dptrain {
namespace {

using testing::expect_data_error;

// A file of `json` (padded as the writer pads) followed by `data`.
std::vector<uint8_t> file_of(std::string json, const std::vector<uint8_t>& data) {
  std::vector<uint8_t> file(8);
  for (int i = 0; i < 8; ++i) file[i] = static_cast<uint8_t>(json.size() >> (8 * i));
  file.insert(file.end(), json.begin(), json.end());
  file.insert(file.end(), data.begin(), data.end());
  return file;
}

TEST(Safetensors, WriterLayoutIsTheStandardOne) {
  const auto bytes = serialize_safetensors(
      {{"a", torch::tensor({1.0f, 2.0f})}, {"b", torch::tensor({int64_t{3}})}}, {{"k", "v"}});
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t{bytes[i]} << (8 * i);
  const std::string json(bytes.begin() + 8, bytes.begin() + 8 + static_cast<long>(n));
  // The model's order, offsets from the data's start, the data 8-byte aligned by spaces.
  EXPECT_EQ(json,
            "{\"__metadata__\":{\"k\":\"v\"},"
            "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
            "\"b\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[8,16]}}   ");
  EXPECT_EQ((8 + n) % 8, 0u);
  ASSERT_EQ(bytes.size(), 8 + n + 16);
  float a[2];
  std::memcpy(a, bytes.data() + 8 + n, sizeof a);
  EXPECT_EQ(a[0], 1.0f);
  EXPECT_EQ(a[1], 2.0f);
}

TEST(Safetensors, RoundTripOfEveryDtypeIsExact) {
  torch::manual_seed(3);
  const NamedTensors tensors = {
      {"f32", torch::randn({2, 3})},
      {"f64", torch::randn({4}, torch::kFloat64)},
      {"i64", torch::tensor({int64_t{-1}, INT64_MAX})},
      {"bf16", torch::randn({3}).to(torch::kBFloat16)},
      {"f16", torch::randn({2, 2}).to(torch::kFloat16)},
      {"scalar", torch::tensor(5.0f)},
      {"empty", torch::zeros({0, 3})},
      {"transposed", torch::arange(6, torch::kFloat32).reshape({2, 3}).t()},
  };
  const auto [header, read] = parse_safetensors(serialize_safetensors(tensors, {}), "t");
  EXPECT_TRUE(header.metadata.empty());
  ASSERT_EQ(read.size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    SCOPED_TRACE(tensors[i].first);
    EXPECT_EQ(read[i].first, tensors[i].first);
    EXPECT_EQ(read[i].second.scalar_type(), tensors[i].second.scalar_type());
    EXPECT_EQ(read[i].second.sizes(), tensors[i].second.sizes());
    EXPECT_TRUE(torch::equal(read[i].second, tensors[i].second));
  }
}

// The reference implementation's file (tests/fixtures/safetensors/make_tiny.py, PyPI
// safetensors' save_file): every value as that script lists it.
TEST(Safetensors, ReadsAFileThatPyPISafetensorsWrote) {
  const auto bytes = read_regular_file(
      std::string(DPTRAIN_TEST_DATA_DIR) + "/safetensors/tiny.safetensors", "fixture");
  const auto [header, tensors] = parse_safetensors(bytes, "tiny");
  EXPECT_EQ(header.metadata, (SafetensorsMetadata{{"format", "pt"}, {"made_by", "make_tiny.py"}}));
  ASSERT_EQ(tensors.size(), 3u);
  std::map<std::string, torch::Tensor> by_name(tensors.begin(), tensors.end());
  EXPECT_TRUE(torch::equal(by_name.at("weight"),
                           torch::tensor({{1.5f, -2.0f, 0.25f}, {3.0f, -0.125f, 1e-3f}})));
  EXPECT_TRUE(torch::equal(by_name.at("steps"), torch::tensor({int64_t{42}, int64_t{-7000000000}})));
  EXPECT_EQ(by_name.at("scale").scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(torch::equal(by_name.at("scale").to(torch::kFloat32),
                           torch::tensor({1.0f, -2.5f, 0.0078125f})));
  // And our writer gives the same tensors the same offsets (the JSON's spacing may differ).
  const auto ours = parse_safetensors(serialize_safetensors(tensors, header.metadata), "ours");
  ASSERT_EQ(ours.first.entries.size(), header.entries.size());
  for (size_t i = 0; i < header.entries.size(); ++i) {
    EXPECT_EQ(ours.first.entries[i].name, header.entries[i].name);
    EXPECT_EQ(ours.first.entries[i].end - ours.first.entries[i].begin,
              header.entries[i].end - header.entries[i].begin);
  }
}

TEST(Safetensors, EveryHeaderFaultIsNamed) {
  const std::vector<uint8_t> four(4, 0);
  const std::string ok = R"("a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]})";
  const struct {
    const char* what;
    std::string json;
    std::vector<uint8_t> data;
    std::string phrase;
  } cases[] = {
      {"not an object", "[1,2]", {}, "not a JSON object"},
      {"bad JSON", "{\"a\":", {}, "corrupt: the header is not valid JSON"},
      {"unknown dtype", R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})", four,
       "tensor 'a' has dtype \"U8\""},
      {"unknown field", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":1}})", four,
       "tensor 'a' has an unknown field 'x'"},
      {"negative dimension", R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", four,
       "tensor 'a' has a bad dimension -1"},
      {"float dimension", R"({"a":{"dtype":"F32","shape":[1.0],"data_offsets":[0,4]}})", four,
       "tensor 'a' has a bad dimension"},
      {"rank 9", R"({"a":{"dtype":"F32","shape":[1,1,1,1,1,1,1,1,1],"data_offsets":[0,4]}})",
       four, "no shape of rank 0 to 8"},
      {"shape past the data", R"({"a":{"dtype":"F32","shape":[1048576,1048576],"data_offsets":[0,4]}})",
       four, "tensor 'a' has a shape larger than the data (4 bytes)"},
      {"bytes not the shape's", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})",
       std::vector<uint8_t>(8, 0), "takes 8 bytes"},
      {"hole", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
       std::vector<uint8_t>(8, 0), "starts at byte 4 of the data, where 0 was expected"},
      {"overlap", "{" + ok + R"(,"b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", four,
       "where 4 was expected"},
      {"data longer than the tensors", "{" + ok + "}", std::vector<uint8_t>(8, 0),
       "the tensors take 4 bytes of data, the file holds 8"},
      {"metadata not strings", R"({"__metadata__":{"k":1}})", {}, "__metadata__ 'k' is not a string"},
      {"metadata not an object", R"({"__metadata__":[]})", {}, "__metadata__ is not an object"},
      {"offsets missing", R"({"a":{"dtype":"F32","shape":[1]}})", four, "no data_offsets"},
      {"a name twice", "{" + ok + "," + ok + "}", four,
       "corrupt: the header is not valid JSON: the name 'a' appears twice"},
      // Note [One JSON text, one reading]: what PyPI safetensors or read_checkpoint.py refuse.
      {"a field twice in an entry",
       R"({"a":{"dtype":"F32","dtype":"F32","shape":[1],"data_offsets":[0,4]}})", four,
       "corrupt: the header is not valid JSON: the name 'dtype' appears twice"},
      {"a metadata key twice", R"({"__metadata__":{"k":"1","k":"2"},)" + ok + "}", four,
       "corrupt: the header is not valid JSON: the name 'k' appears twice"},
      {"bytes after a NUL", "{" + ok + std::string("}\0{\"b\":1}", 9), four,
       "corrupt: the header is not valid JSON: a NUL byte at byte 54 of 62"},
      {"a NUL as padding", "{" + ok + std::string("}\0\0", 3), four,
       "corrupt: the header is not valid JSON: a NUL byte at byte 54 of 56"},
      {"a byte after the object", "{" + ok + "}x", four,
       "corrupt: the header is not valid JSON: [json.exception.parse_error.101] parse error at "
       "line 1, column 55: syntax error while parsing value - invalid literal; last read: "
       "'4]}}x'; expected end of input"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    expect_data_error([&] { parse_safetensors(file_of(c.json, c.data), "bad.safetensors"); },
                      {"bad.safetensors: ", c.phrase});
  }
}

// The specification pads with spaces; a JSON text may end in any JSON whitespace, and PyPI
// safetensors reads such a header too.
TEST(Safetensors, AHeaderMayEndInJsonWhitespace) {
  const std::string ok = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  for (const std::string tail : {"    ", " \t\r\n", "\n"}) {
    SCOPED_TRACE(printable(tail));
    const auto [header, tensors] = parse_safetensors(file_of(ok + tail, {0, 0, 128, 63}), "ws");
    ASSERT_EQ(tensors.size(), 1u);
    EXPECT_EQ(tensors[0].second.item<float>(), 1.0f);
  }
}

// A crafted header nests arrays a hundred thousand deep where a dimension, a dtype or an offset
// belongs: refused in one line (a message that dumped the value recursed once per level and
// overflowed the stack: a segfault in `eval --model`).
TEST(Safetensors, DeeplyNestedValuesAreRefusedWithoutRecursing) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  const std::vector<uint8_t> four(4, 0);
  expect_data_error(
      [&] {
        parse_safetensors(file_of(R"({"a":{"dtype":"F32","shape":[)" + deep +
                                      R"(],"data_offsets":[0,4]}})", four), "deep");
      },
      {"deep: tensor 'a' has a bad dimension an array"});
  expect_data_error(
      [&] {
        parse_safetensors(file_of(R"({"a":{"dtype":)" + deep + R"(,"shape":[1],"data_offsets":[0,4]}})",
                                  four), "deep");
      },
      {"deep: tensor 'a' has no dtype"});
  expect_data_error(
      [&] {
        parse_safetensors(file_of(R"({"a":{"dtype":"F32","shape":[1048576,1048576,)" + deep +
                                      R"(],"data_offsets":[0,4]}})", four), "deep");
      },
      {"deep: tensor 'a' has a shape larger than the data (4 bytes)"});
}

TEST(Safetensors, HeaderLengthIsCheckedBeforeTheHeaderIsRead) {
  std::vector<uint8_t> file(16, ' ');
  const auto put = [&](uint64_t n) {
    for (int i = 0; i < 8; ++i) file[i] = static_cast<uint8_t>(n >> (8 * i));
  };
  put(kMaxSafetensorsHeaderBytes + 1);
  expect_data_error([&] { safetensors_header_bytes(file.data(), uint64_t{1} << 40, "big"); },
                    {"big: not a safetensors file of dptrain's, or corrupt", "16777217 bytes"});
  put(9);  // one byte more than the file holds after the length
  expect_data_error([&] { safetensors_header_bytes(file.data(), file.size(), "cut"); },
                    {"cut: truncated or corrupt: the header length says 9 bytes, the file has 8"});
  expect_data_error([&] { safetensors_header_bytes(file.data(), 7, "short"); },
                    {"short: truncated: 7 bytes"});
}

}  // namespace
}  // namespace dptrain
