// Reads the PNG screenshots headless Chromium writes and measures how much is drawn on them, so a
// test can tell a rendered plot from a blank page. Only what Chromium writes: 8-bit RGB or RGBA,
// not interlaced. Palettes, grey, 16-bit and Adam7 are refused, not decoded.
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

// Decodes a whole PNG file image: checks the signature and every chunk's CRC, inflates the IDAT
// stream with zlib and undoes each row's filter (None, Sub, Up, Average, Paeth). Throws
// std::runtime_error saying what is wrong.
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
