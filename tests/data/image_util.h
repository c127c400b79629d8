// Test images written with the libraries krab reads them with (libpng, libjpeg): the image
// folder tests and the end-to-end runs of the krab binary share them.
#pragma once

#include <gtest/gtest.h>
#include <jpeglib.h>
#include <png.h>
#include <zlib.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace krab::data::testing {

// Pixel (y, x, channel k) of test image `seed`: distinct per image, pixel and channel.
inline uint8_t pixel(int seed, int y, int x, int k) {
  return static_cast<uint8_t>(seed * 37 + y * 11 + x * 3 + k * 50);
}

inline std::vector<uint8_t> make_pixels(int seed, int h, int w, int c) {
  std::vector<uint8_t> p(h * w * c);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int k = 0; k < c; ++k) p[(y * w + x) * c + k] = pixel(seed, y, x, k);
  return p;
}

inline void write_png(const std::string& path, int h, int w, int c, const std::vector<uint8_t>& p) {
  png_image img;
  std::memset(&img, 0, sizeof(img));
  img.version = PNG_IMAGE_VERSION;
  img.width = w;
  img.height = h;
  img.format = c == 3 ? PNG_FORMAT_RGB : PNG_FORMAT_GRAY;
  ASSERT_TRUE(png_image_write_to_file(&img, path.c_str(), 0, p.data(), 0, nullptr)) << img.message;
}

inline void write_jpeg(const std::string& path, int h, int w, int c,
                       const std::vector<uint8_t>& p) {
  jpeg_compress_struct cinfo;
  jpeg_error_mgr err;
  cinfo.err = jpeg_std_error(&err);
  jpeg_create_compress(&cinfo);
  std::FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  jpeg_stdio_dest(&cinfo, f);
  cinfo.image_width = w;
  cinfo.image_height = h;
  cinfo.input_components = c;
  cinfo.in_color_space = c == 3 ? JCS_RGB : JCS_GRAYSCALE;
  jpeg_set_defaults(&cinfo);
  jpeg_set_quality(&cinfo, 100, TRUE);
  jpeg_start_compress(&cinfo, TRUE);
  while (cinfo.next_scanline < cinfo.image_height) {
    JSAMPROW row = const_cast<uint8_t*>(p.data()) + cinfo.next_scanline * w * c;
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  jpeg_destroy_compress(&cinfo);
  std::fclose(f);
}

// Damages the pixel data of the PNG at `path` (its IDAT chunk's payload, so its CRC no longer
// matches) and leaves the signature, the header and the IEND trailer intact: a file that passes
// the header check at listing and fails only when decoded.
inline void damage_png_pixels(const std::string& path) {
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  const size_t at = bytes.find("IDAT");
  ASSERT_NE(at, std::string::npos) << path;
  for (size_t k = at + 4; k < at + 10 && k + 16 < bytes.size(); ++k) bytes[k] ^= 0x5A;
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// One PNG chunk: length, type, data, CRC.
inline std::string png_chunk(const std::string& type, const std::string& data) {
  auto be32 = [](uint32_t v) {
    return std::string{static_cast<char>(v >> 24), static_cast<char>(v >> 16),
                       static_cast<char>(v >> 8), static_cast<char>(v)};
  };
  const std::string body = type + data;
  const uLong crc = crc32(0, reinterpret_cast<const Bytef*>(body.data()), body.size());
  return be32(static_cast<uint32_t>(data.size())) + body + be32(static_cast<uint32_t>(crc));
}

// A PNG of a few dozen bytes whose header (valid, CRC and all) states `height` x `width` grey
// pixels: a decompression bomb, whose pixel data is one empty zlib stream. With `trailer` it
// ends with IEND as a complete file does, so that a check of the header alone passes it.
inline std::string png_stating(uint32_t height, uint32_t width, bool trailer) {
  std::string ihdr;
  for (const uint32_t v : {width, height})
    for (int s = 24; s >= 0; s -= 8) ihdr.push_back(static_cast<char>(v >> s));
  ihdr += std::string("\x08\x00\x00\x00\x00", 5);                 // depth 8, grey, no interlace
  const std::string idat("\x78\x9c\x03\x00\x00\x00\x00\x01", 8);  // zlib of nothing
  std::string png =
      std::string("\x89PNG\r\n\x1a\n", 8) + png_chunk("IHDR", ihdr) + png_chunk("IDAT", idat);
  return trailer ? png + png_chunk("IEND", "") : png;
}

// A JPEG of a few hundred bytes whose frame header states `height` x `width` RGB pixels and
// whose data is cut short after the scan header: libjpeg only warns at such an end and fills the
// rest of the image, so it decodes at the size stated. Made from a real 8x8 JPEG.
inline std::string jpeg_stating(uint16_t height, uint16_t width) {
  jpeg_compress_struct cinfo;
  jpeg_error_mgr err;
  cinfo.err = jpeg_std_error(&err);
  jpeg_create_compress(&cinfo);
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&cinfo, &buf, &size);
  cinfo.image_width = 8;
  cinfo.image_height = 8;
  cinfo.input_components = 3;
  cinfo.in_color_space = JCS_RGB;
  jpeg_set_defaults(&cinfo);
  jpeg_start_compress(&cinfo, TRUE);
  const std::vector<uint8_t> p = make_pixels(1, 8, 8, 3);
  while (cinfo.next_scanline < cinfo.image_height) {
    JSAMPROW row = const_cast<uint8_t*>(p.data()) + cinfo.next_scanline * 8 * 3;
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  jpeg_destroy_compress(&cinfo);
  std::string jpeg(reinterpret_cast<const char*>(buf), size);
  std::free(buf);
  const size_t sof = jpeg.find("\xFF\xC0");  // baseline frame header: FF C0, length, precision
  const size_t sos = jpeg.find("\xFF\xDA");  // scan header: FF DA, length, ...
  EXPECT_TRUE(sof != std::string::npos && sos != std::string::npos && sos > sof);
  if (sof == std::string::npos || sos == std::string::npos) return jpeg;
  jpeg[sof + 5] = static_cast<char>(height >> 8), jpeg[sof + 6] = static_cast<char>(height);
  jpeg[sof + 7] = static_cast<char>(width >> 8), jpeg[sof + 8] = static_cast<char>(width);
  const size_t scan = sos + 2 +
                      ((static_cast<unsigned char>(jpeg[sos + 2]) << 8) |
                       static_cast<unsigned char>(jpeg[sos + 3]));
  return jpeg.substr(0, scan + 16);
}

}  // namespace krab::data::testing
