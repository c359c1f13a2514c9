// Reads the PNG screenshots headless Chromium writes (decoded by libpng) and measures how much is
// drawn on them, so a test can tell a rendered plot from a blank page. 8-bit images only: libpng
// would convert 16-bit ones from linear light, so they are refused rather than altered.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dptrain::testing {

struct RgbImage {
  int64_t width = 0;
  int64_t height = 0;
  std::vector<uint8_t> rgb;  // (height, width, 3); RGBA is composited over white
};

// Decodes a whole PNG file image with libpng's simplified API (which checks the signature and
// every CRC). Grey and palette images come out as RGB. Throws std::runtime_error with libpng's
// reason.
RgbImage decode_png(const std::vector<uint8_t>& bytes);
RgbImage read_png(const std::string& path);

struct InkSummary {
  int64_t pixels = 0;
  int64_t non_background = 0;  // any channel differs from white (255, 255, 255)
  int64_t dark = 0;            // every channel below 128: axes, text
  // Colours, other than white, that cover at least kColourMinPixels pixels: the solid parts of
  // lines and text, not the one-off shades of anti-aliased edges.
  int64_t distinct_colours = 0;
};
constexpr int64_t kColourMinPixels = 20;

InkSummary measure_ink(const RgbImage& image);

// Pixels whose every channel is within `tolerance` of (r, g, b).
int64_t count_near(const RgbImage& image, uint8_t r, uint8_t g, uint8_t b, int tolerance);

// Nothing drawn worth the name: fewer than 50 non-white pixels (allowing a stray cursor or
// scrollbar edge, never a line or a word).
bool looks_blank(const InkSummary& ink);

}  // namespace dptrain::testing
