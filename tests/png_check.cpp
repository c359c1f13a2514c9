// A minimal PNG decoder and ink counter for the plot test; see png_check.h.
// Follows the PNG specification (W3C, 2nd edition): chunk layout, CRC-32 over type and data,
// one filter byte per scanline, filter method 0.
#include "png_check.h"

#include <zlib.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <stdexcept>

namespace dptrain::testing {

namespace {

uint32_t big_endian_u32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

[[noreturn]] void bad_png(const std::string& what) { throw std::runtime_error("PNG: " + what); }

// The Paeth predictor of the specification, section 9.4: whichever of left, above and upper-left
// is closest to left + above - upper-left, ties going in that order.
uint8_t paeth(int a, int b, int c) {
  const int p = a + b - c;
  const int pa = std::abs(p - a), pb = std::abs(p - b), pc = std::abs(p - c);
  if (pa <= pb && pa <= pc) return static_cast<uint8_t>(a);
  if (pb <= pc) return static_cast<uint8_t>(b);
  return static_cast<uint8_t>(c);
}

}  // namespace

RgbImage decode_png(const std::vector<uint8_t>& bytes) {
  static const uint8_t kSignature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  if (bytes.size() < 8 || !std::equal(kSignature, kSignature + 8, bytes.begin())) {
    bad_png("no PNG signature");
  }
  uint32_t width = 0, height = 0;
  int channels = 0;
  bool have_header = false, have_end = false;
  std::vector<uint8_t> compressed;
  for (size_t at = 8; at < bytes.size() && !have_end;) {
    if (bytes.size() - at < 12) bad_png("a chunk is cut short at byte " + std::to_string(at));
    const uint32_t length = big_endian_u32(&bytes[at]);
    if (length > bytes.size() - at - 12) bad_png("a chunk runs past the end of the file");
    const std::string type(reinterpret_cast<const char*>(&bytes[at + 4]), 4);
    const uint8_t* data = &bytes[at + 8];
    const uLong crc = crc32(crc32(0, nullptr, 0), &bytes[at + 4], length + 4);
    if (crc != big_endian_u32(data + length)) bad_png("chunk " + type + " fails its CRC");
    if (type == "IHDR") {
      if (length != 13) bad_png("IHDR is not 13 bytes");
      width = big_endian_u32(data);
      height = big_endian_u32(data + 4);
      const int depth = data[8], colour = data[9], interlace = data[12];
      if (depth != 8 || (colour != 2 && colour != 6)) {
        bad_png("bit depth " + std::to_string(depth) + ", colour type " + std::to_string(colour) +
                ": only 8-bit RGB (2) or RGBA (6) is read");
      }
      if (data[10] != 0 || data[11] != 0 || interlace != 0) {
        bad_png("only compression 0, filter method 0 and no interlacing are read");
      }
      if (width == 0 || height == 0 || width > 16384 || height > 16384) {
        bad_png("size " + std::to_string(width) + "x" + std::to_string(height) + " out of range");
      }
      channels = colour == 2 ? 3 : 4;
      have_header = true;
    } else if (type == "IDAT") {
      if (!have_header) bad_png("IDAT before IHDR");
      compressed.insert(compressed.end(), data, data + length);
    } else if (type == "IEND") {
      have_end = true;
    }
    at += 12 + size_t{length};
  }
  if (!have_header || !have_end) bad_png("no IHDR or no IEND");

  const size_t stride = size_t{width} * static_cast<size_t>(channels);
  std::vector<uint8_t> filtered(size_t{height} * (stride + 1));
  z_stream stream{};
  if (inflateInit(&stream) != Z_OK) bad_png("inflateInit failed");
  stream.next_in = compressed.data();
  stream.avail_in = static_cast<uInt>(compressed.size());
  stream.next_out = filtered.data();
  stream.avail_out = static_cast<uInt>(filtered.size());
  const int status = inflate(&stream, Z_FINISH);
  const size_t produced = stream.total_out;
  inflateEnd(&stream);
  if (status != Z_STREAM_END || produced != filtered.size()) {
    bad_png("the image data inflates to " + std::to_string(produced) + " bytes (zlib status " +
            std::to_string(status) + "), expected " + std::to_string(filtered.size()));
  }

  // Undo the filters, row by row, each against the already decoded row above.
  std::vector<uint8_t> raw(size_t{height} * stride);
  for (size_t y = 0; y < height; ++y) {
    const uint8_t filter = filtered[y * (stride + 1)];
    const uint8_t* in = &filtered[y * (stride + 1) + 1];
    uint8_t* row = &raw[y * stride];
    const uint8_t* above = y > 0 ? &raw[(y - 1) * stride] : nullptr;
    for (size_t i = 0; i < stride; ++i) {
      const int a = i >= static_cast<size_t>(channels) ? row[i - channels] : 0;
      const int b = above ? above[i] : 0;
      const int c = above && i >= static_cast<size_t>(channels) ? above[i - channels] : 0;
      int predicted = 0;
      switch (filter) {
        case 0:
          predicted = 0;
          break;
        case 1:
          predicted = a;
          break;
        case 2:
          predicted = b;
          break;
        case 3:
          predicted = (a + b) / 2;
          break;
        case 4:
          predicted = paeth(a, b, c);
          break;
        default:
          bad_png("row " + std::to_string(y) + " has filter type " + std::to_string(filter));
      }
      row[i] = static_cast<uint8_t>(in[i] + predicted);
    }
  }

  RgbImage image;
  image.width = width;
  image.height = height;
  image.rgb.resize(size_t{width} * height * 3);
  for (size_t p = 0; p < size_t{width} * height; ++p) {
    const uint8_t* pixel = &raw[p * static_cast<size_t>(channels)];
    const int alpha = channels == 4 ? pixel[3] : 255;
    for (int k = 0; k < 3; ++k) {  // over white: c * a + 255 * (1 - a), rounded
      image.rgb[p * 3 + static_cast<size_t>(k)] =
          static_cast<uint8_t>((pixel[k] * alpha + 255 * (255 - alpha) + 127) / 255);
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
