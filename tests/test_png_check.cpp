// Tests for the PNG checker the plot test relies on (png_check.h), on PNGs made by hand here with
// an independent encoder: every row filter, RGB and RGBA, split IDAT, corrupt files, ink counts.
// Not here: Chromium (test_plot.cpp).
#include <gtest/gtest.h>
#include <zlib.h>

#include <algorithm>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "png_check.h"

namespace dptrain::testing {
namespace {

void put_u32(std::vector<uint8_t>& out, uint32_t value) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<uint8_t>(value >> shift));
}

void put_chunk(std::vector<uint8_t>& out, const std::string& type,
               const std::vector<uint8_t>& data) {
  put_u32(out, static_cast<uint32_t>(data.size()));
  std::vector<uint8_t> body(type.begin(), type.end());
  body.insert(body.end(), data.begin(), data.end());
  out.insert(out.end(), body.begin(), body.end());
  put_u32(out, static_cast<uint32_t>(crc32(0, body.data(), static_cast<uInt>(body.size()))));
}

// The forward filter of the specification: each byte minus its predictor from the raw bytes
// left (a), above (b) and upper-left (c).
uint8_t predictor(int filter, int a, int b, int c) {
  switch (filter) {
    case 1:
      return static_cast<uint8_t>(a);
    case 2:
      return static_cast<uint8_t>(b);
    case 3:
      return static_cast<uint8_t>((a + b) >> 1);
    case 4: {
      const int p = a + b - c, pa = std::abs(p - a), pb = std::abs(p - b), pc = std::abs(p - c);
      return static_cast<uint8_t>(pa <= pb && pa <= pc ? a : pb <= pc ? b : c);
    }
    default:
      return 0;
  }
}

struct PngSpec {
  uint32_t width = 0, height = 0;
  int channels = 3;             // 3 = RGB, 4 = RGBA
  std::vector<uint8_t> pixels;  // (height, width, channels)
  std::vector<int> filters;     // one per row
  int bit_depth = 8;
  size_t idat_pieces = 1;  // the zlib stream split over this many IDAT chunks
};

std::vector<uint8_t> encode_png(const PngSpec& spec) {
  const size_t stride = spec.width * static_cast<size_t>(spec.channels);
  std::vector<uint8_t> filtered;
  for (size_t y = 0; y < spec.height; ++y) {
    const int filter = spec.filters[y];
    filtered.push_back(static_cast<uint8_t>(filter));
    for (size_t i = 0; i < stride; ++i) {
      const auto raw = [&](size_t row, size_t column) {
        return spec.pixels[row * stride + column];
      };
      const int a = i >= static_cast<size_t>(spec.channels) ? raw(y, i - spec.channels) : 0;
      const int b = y > 0 ? raw(y - 1, i) : 0;
      const int c =
          y > 0 && i >= static_cast<size_t>(spec.channels) ? raw(y - 1, i - spec.channels) : 0;
      filtered.push_back(static_cast<uint8_t>(raw(y, i) - predictor(filter, a, b, c)));
    }
  }
  std::vector<uint8_t> compressed(compressBound(static_cast<uLong>(filtered.size())));
  uLongf size = static_cast<uLongf>(compressed.size());
  EXPECT_EQ(
      compress(compressed.data(), &size, filtered.data(), static_cast<uLong>(filtered.size())),
      Z_OK);
  compressed.resize(size);

  std::vector<uint8_t> png = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  std::vector<uint8_t> header;
  put_u32(header, spec.width);
  put_u32(header, spec.height);
  header.push_back(static_cast<uint8_t>(spec.bit_depth));
  header.push_back(spec.channels == 3 ? 2 : 6);
  header.insert(header.end(), {0, 0, 0});
  put_chunk(png, "IHDR", header);
  put_chunk(png, "tEXt", {'k', 0, 'v'});  // an ancillary chunk the decoder must pass over
  const size_t piece = (compressed.size() + spec.idat_pieces - 1) / spec.idat_pieces;
  for (size_t at = 0; at < compressed.size(); at += piece) {
    put_chunk(png, "IDAT",
              std::vector<uint8_t>(
                  compressed.begin() + static_cast<long>(at),
                  compressed.begin() + static_cast<long>(std::min(at + piece, compressed.size()))));
  }
  put_chunk(png, "IEND", {});
  return png;
}

// A 7x10 image of varied bytes (so every predictor matters), rows cycling through filters 0-4.
PngSpec varied_image(int channels) {
  PngSpec spec;
  spec.width = 7;
  spec.height = 10;
  spec.channels = channels;
  uint32_t state = 12345;
  for (size_t i = 0; i < spec.width * spec.height * static_cast<size_t>(channels); ++i) {
    state = state * 1103515245u + 12345u;
    spec.pixels.push_back(static_cast<uint8_t>(state >> 16));
  }
  for (size_t y = 0; y < spec.height; ++y) spec.filters.push_back(static_cast<int>(y % 5));
  return spec;
}

TEST(PlotPngCheck, DecodesEveryFilterOnRgb) {
  const PngSpec spec = varied_image(3);
  const RgbImage image = decode_png(encode_png(spec));
  EXPECT_EQ(image.width, 7);
  EXPECT_EQ(image.height, 10);
  EXPECT_EQ(image.rgb, spec.pixels);
}

TEST(PlotPngCheck, SplitImageDataAndEveryRowPaeth) {
  PngSpec spec = varied_image(3);
  spec.idat_pieces = 3;
  spec.filters.assign(spec.height, 4);
  EXPECT_EQ(decode_png(encode_png(spec)).rgb, spec.pixels);
}

TEST(PlotPngCheck, RgbaIsCompositedOverWhite) {
  PngSpec spec = varied_image(4);
  const RgbImage image = decode_png(encode_png(spec));
  for (size_t p = 0; p < spec.width * spec.height; ++p) {
    const uint8_t* in = &spec.pixels[p * 4];
    for (int k = 0; k < 3; ++k) {
      const double expected = (in[k] * in[3] + 255.0 * (255 - in[3])) / 255.0;
      EXPECT_NEAR(image.rgb[p * 3 + static_cast<size_t>(k)], expected, 0.5 + 1e-9) << p;
    }
  }
  // Fully transparent is white, fully opaque is the colour itself.
  spec.pixels = {10, 20, 30, 0, 10, 20, 30, 255};
  spec.width = 2;
  spec.height = 1;
  spec.filters = {1};
  EXPECT_EQ(decode_png(encode_png(spec)).rgb, (std::vector<uint8_t>{255, 255, 255, 10, 20, 30}));
}

TEST(PlotPngCheck, RefusesBrokenFiles) {
  const std::vector<uint8_t> good = encode_png(varied_image(3));
  const auto expect_refused = [](const std::vector<uint8_t>& bytes, const std::string& phrase) {
    try {
      decode_png(bytes);
      ADD_FAILURE() << "accepted; expected \"" << phrase << "\"";
    } catch (const std::runtime_error& error) {
      EXPECT_NE(std::string(error.what()).find(phrase), std::string::npos) << error.what();
    }
  };
  std::vector<uint8_t> bytes = good;
  bytes[0] = 'X';
  expect_refused(bytes, "signature");
  bytes = good;
  bytes[20] ^= 1;  // inside IHDR's data
  expect_refused(bytes, "CRC");
  expect_refused(std::vector<uint8_t>(good.begin(), good.begin() + 60), "");
  expect_refused({}, "signature");

  PngSpec spec = varied_image(3);
  spec.bit_depth = 16;
  expect_refused(encode_png(spec), "bit depth 16");
  spec = varied_image(3);
  spec.filters[3] = 7;
  expect_refused(encode_png(spec), "filter type 7");
  const std::vector<uint8_t> short_data = [&] {
    PngSpec shorter = varied_image(3);
    shorter.height = 9;  // encode 9 rows...
    std::vector<uint8_t> png = encode_png(shorter);
    png[8 + 8 + 7] = 10;  // ...but declare 10 (IHDR height, low byte); fix its CRC
    const uLong crc = crc32(0, &png[8 + 4], 17);
    for (int k = 0; k < 4; ++k) png[8 + 8 + 13 + k] = static_cast<uint8_t>(crc >> (24 - 8 * k));
    return png;
  }();
  expect_refused(short_data, "inflates to");
}

TEST(PlotPngCheck, MeasuresInk) {
  RgbImage white;
  white.width = 40;
  white.height = 30;
  white.rgb.assign(40 * 30 * 3, 255);
  InkSummary ink = measure_ink(white);
  EXPECT_EQ(ink.pixels, 1200);
  EXPECT_EQ(ink.non_background, 0);
  EXPECT_TRUE(looks_blank(ink));

  RgbImage drawn = white;
  const auto paint = [&](int x0, int y0, int w, int h, uint8_t r, uint8_t g, uint8_t b) {
    for (int y = y0; y < y0 + h; ++y) {
      for (int x = x0; x < x0 + w; ++x) {
        uint8_t* p = &drawn.rgb[(static_cast<size_t>(y) * 40 + static_cast<size_t>(x)) * 3];
        p[0] = r, p[1] = g, p[2] = b;
      }
    }
  };
  paint(0, 0, 10, 10, 0x1f, 0x77, 0xb4);  // 100 blue
  paint(10, 0, 5, 6, 20, 20, 20);         // 30 near black
  paint(20, 20, 3, 3, 0xbf, 0x00, 0xbf);  // 9 magenta: too few to count as a colour
  ink = measure_ink(drawn);
  EXPECT_EQ(ink.non_background, 139);
  EXPECT_EQ(ink.dark, 30);
  EXPECT_EQ(ink.distinct_colours, 2);
  EXPECT_FALSE(looks_blank(ink));
  EXPECT_EQ(count_near(drawn, 0x20, 0x70, 0xb0, 10), 100);
  EXPECT_EQ(count_near(drawn, 0x20, 0x70, 0xb0, 3), 0);
  EXPECT_EQ(count_near(drawn, 0xbf, 0x00, 0xbf, 0), 9);
}

}  // namespace
}  // namespace dptrain::testing
