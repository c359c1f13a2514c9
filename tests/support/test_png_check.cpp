// Tests for the PNG reader the plot test relies on (png_check.h), on PNGs that libpng writes
// here: RGB, RGBA composited over white, grey, broken files, and the ink counts.
// Not here: Chromium (test_plot.cpp).
#include <gtest/gtest.h>
#include <png.h>
#include <zlib.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "support/png_check.h"

namespace dptrain::testing {
namespace {

// A PNG of `pixels` ((height, width, channels) bytes, or 16-bit words for a linear format)
// in libpng's `format`, written by libpng.
std::vector<uint8_t> encode_png(uint32_t width, uint32_t height, uint32_t format,
                                const void* pixels) {
  png_image png{};
  png.version = PNG_IMAGE_VERSION;
  png.width = width;
  png.height = height;
  png.format = format;
  png_alloc_size_t size = 0;
  EXPECT_NE(png_image_write_get_memory_size(png, size, 0, pixels, 0, nullptr), 0) << png.message;
  std::vector<uint8_t> bytes(size);
  EXPECT_NE(png_image_write_to_memory(&png, bytes.data(), &size, 0, pixels, 0, nullptr), 0)
      << png.message;
  bytes.resize(size);
  return bytes;
}

// A 7x10 image of varied bytes: `channels` (1, 3 or 4) per pixel.
std::vector<uint8_t> varied_pixels(int channels) {
  std::vector<uint8_t> pixels;
  uint32_t state = 12345;
  for (size_t i = 0; i < 7 * 10 * static_cast<size_t>(channels); ++i) {
    state = state * 1103515245u + 12345u;
    pixels.push_back(static_cast<uint8_t>(state >> 16));
  }
  return pixels;
}

TEST(PlotPngCheck, DecodesRgb) {
  const std::vector<uint8_t> pixels = varied_pixels(3);
  const RgbImage image = decode_png(encode_png(7, 10, PNG_FORMAT_RGB, pixels.data()));
  EXPECT_EQ(image.width, 7);
  EXPECT_EQ(image.height, 10);
  EXPECT_EQ(image.rgb, pixels);
}

TEST(PlotPngCheck, GreyComesOutAsRgb) {
  const std::vector<uint8_t> grey = varied_pixels(1);
  std::vector<uint8_t> expected;
  for (uint8_t g : grey) expected.insert(expected.end(), {g, g, g});
  EXPECT_EQ(decode_png(encode_png(7, 10, PNG_FORMAT_GRAY, grey.data())).rgb, expected);
}

TEST(PlotPngCheck, RgbaIsCompositedOverWhite) {
  const std::vector<uint8_t> pixels = varied_pixels(4);
  const RgbImage image = decode_png(encode_png(7, 10, PNG_FORMAT_RGBA, pixels.data()));
  for (size_t p = 0; p < 7 * 10; ++p) {
    const uint8_t* in = &pixels[p * 4];
    for (int k = 0; k < 3; ++k) {
      const double expected = (in[k] * in[3] + 255.0 * (255 - in[3])) / 255.0;
      EXPECT_NEAR(image.rgb[p * 3 + static_cast<size_t>(k)], expected, 0.5 + 1e-9) << p;
    }
  }
  // Fully transparent is white, fully opaque is the colour itself.
  const uint8_t two[] = {10, 20, 30, 0, 10, 20, 30, 255};
  EXPECT_EQ(decode_png(encode_png(2, 1, PNG_FORMAT_RGBA, two)).rgb,
            (std::vector<uint8_t>{255, 255, 255, 10, 20, 30}));
}

TEST(PlotPngCheck, RefusesBrokenFiles) {
  const std::vector<uint8_t> pixels = varied_pixels(3);
  const std::vector<uint8_t> good = encode_png(7, 10, PNG_FORMAT_RGB, pixels.data());
  const auto expect_refused = [](const std::vector<uint8_t>& bytes, const std::string& phrase) {
    try {
      decode_png(bytes);
      ADD_FAILURE() << "accepted; expected \"" << phrase << "\"";
    } catch (const std::runtime_error& error) {
      const std::string message = error.what();
      EXPECT_EQ(message.rfind("PNG: ", 0), 0u) << message;
      EXPECT_NE(message.find(phrase), std::string::npos) << message;
    }
  };
  std::vector<uint8_t> bytes = good;
  bytes[0] = 'X';
  expect_refused(bytes, "Not a PNG file");
  bytes = good;
  bytes[20] ^= 1;  // inside IHDR's data
  expect_refused(bytes, "IHDR: CRC error");
  expect_refused(std::vector<uint8_t>(good.begin(), good.begin() + 60), "read beyond end of data");
  expect_refused({}, "invalid argument");

  const std::vector<uint16_t> wide(7 * 10 * 3, 1000);
  expect_refused(encode_png(7, 10, PNG_FORMAT_LINEAR_RGB, wide.data()), "bit depth 16");
  // Nine rows of image data under a header that declares ten (IHDR's height, its CRC fixed).
  std::vector<uint8_t> short_data = encode_png(7, 9, PNG_FORMAT_RGB, pixels.data());
  short_data[8 + 8 + 7] = 10;
  const uLong crc = crc32(0, &short_data[8 + 4], 17);
  for (int k = 0; k < 4; ++k)
    short_data[8 + 8 + 13 + k] = static_cast<uint8_t>(crc >> (24 - 8 * k));
  expect_refused(short_data, "Not enough image data");
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
