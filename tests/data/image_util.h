// Test images written with the libraries krab reads them with (libpng, libjpeg): the image
// folder tests and the end-to-end runs of the krab binary share them.
#pragma once

#include <gtest/gtest.h>
#include <jpeglib.h>
#include <png.h>

#include <cstdint>
#include <cstdio>
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

}  // namespace krab::data::testing
