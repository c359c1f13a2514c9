// The PNG reader and ink counter for the plot test, on libpng's simplified API; see png_check.h.
#include "support/png_check.h"

#include <png.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <stdexcept>

namespace dptrain::testing {

namespace {

[[noreturn]] void bad_png(const std::string& what) { throw std::runtime_error("PNG: " + what); }

}  // namespace

RgbImage decode_png(const std::vector<uint8_t>& bytes) {
  png_image png{};
  png.version = PNG_IMAGE_VERSION;
  if (png_image_begin_read_from_memory(&png, bytes.data(), bytes.size()) == 0) {
    bad_png(png.message);
  }
  if ((png.format & PNG_FORMAT_FLAG_LINEAR) != 0 || png.width > 16384 || png.height > 16384) {
    png_image_free(&png);
    bad_png("bit depth 16 or a size over 16384: only 8-bit screenshots are read");
  }
  // Read with alpha and composite here: libpng would composite in linear light.
  png.format = PNG_FORMAT_RGBA;
  std::vector<uint8_t> rgba(PNG_IMAGE_SIZE(png));
  if (png_image_finish_read(&png, nullptr, rgba.data(), 0, nullptr) == 0) bad_png(png.message);

  RgbImage image;
  image.width = png.width;
  image.height = png.height;
  image.rgb.resize(rgba.size() / 4 * 3);
  for (size_t p = 0; p < rgba.size() / 4; ++p) {
    const uint8_t* pixel = &rgba[p * 4];
    for (size_t k = 0; k < 3; ++k) {  // over white: c * a + 255 * (1 - a), rounded
      image.rgb[p * 3 + k] =
          static_cast<uint8_t>((pixel[k] * pixel[3] + 255 * (255 - pixel[3]) + 127) / 255);
    }
  }
  return image;
}

RgbImage read_png(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                                   std::istreambuf_iterator<char>());
  try {
    return decode_png(bytes);
  } catch (const std::runtime_error& error) {
    throw std::runtime_error(path + ": " + error.what());
  }
}

InkSummary measure_ink(const RgbImage& image) {
  InkSummary ink;
  std::map<uint32_t, int64_t> colours;
  for (size_t p = 0; p + 2 < image.rgb.size(); p += 3) {
    const uint8_t r = image.rgb[p], g = image.rgb[p + 1], b = image.rgb[p + 2];
    ++ink.pixels;
    if (r == 255 && g == 255 && b == 255) continue;
    ++ink.non_background;
    if (r < 128 && g < 128 && b < 128) ++ink.dark;
    ++colours[(uint32_t{r} << 16) | (uint32_t{g} << 8) | b];
  }
  for (const auto& [colour, count] : colours) {
    if (count >= kColourMinPixels) ++ink.distinct_colours;
  }
  return ink;
}

int64_t count_near(const RgbImage& image, uint8_t r, uint8_t g, uint8_t b, int tolerance) {
  int64_t count = 0;
  for (size_t p = 0; p + 2 < image.rgb.size(); p += 3) {
    if (std::abs(image.rgb[p] - r) <= tolerance && std::abs(image.rgb[p + 1] - g) <= tolerance &&
        std::abs(image.rgb[p + 2] - b) <= tolerance) {
      ++count;
    }
  }
  return count;
}

bool looks_blank(const InkSummary& ink) { return ink.non_background < 50; }

}  // namespace dptrain::testing
