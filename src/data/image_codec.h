// Image files to pixels, and pixels to the float tensors a model trains on.
//
// Two formats, read with Debian's libraries: PNG (libpng's simplified API: every bit depth,
// palette and interlaced files, 16-bit samples scaled to 8) and JPEG (libjpeg-turbo, baseline
// and progressive). The format is found from the file's first bytes, not its name, so a JPEG
// saved as ".png" still reads. Alpha is dropped (composited on nothing: the colour channels are
// kept as stored); colour is kept as grey (1 channel) or RGB (3).
//
// Failure: a file that cannot be opened (no permission; a symbolic link to a missing file), that
// is not a regular file (a FIFO, device or socket: checked on the open descriptor, never read,
// so it cannot block), is not PNG or JPEG, or that the library refuses (truncated, damaged)
// throws krab::InvalidArgument "image 'PATH' cannot be read: WHY"; nothing is printed
// (libjpeg's and libpng's own warning output is silenced).
//
// Thread safety: every function is safe to call from several threads at once (no shared
// state; each call has its own decoder).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace krab::data {

// Decoded pixels, row-major, channels interleaved (height x width x channels), 8 bits each.
struct Image {
  int64_t height = 0;
  int64_t width = 0;
  int64_t channels = 0;  // 1 (grey) or 3 (RGB)
  std::vector<uint8_t> pixels;
};

// The most pixels (height x width) an image may state unless the caller says otherwise: the
// default of data.max_pixels, 4096 x 4096. A decoded image costs 3 bytes a pixel (48 MiB here)
// on each decoding thread, whatever the file's length: a file's header states its size, and a
// few hundred bytes can state 65535 x 65535 (12 GiB). PIL refuses images over about 179
// megapixels as decompression bombs; krab resizes every image to data.size (tens to hundreds of
// pixels a side), so it needs far less: 16.7 megapixels holds a 4K frame (8.3) and a 12-
// megapixel phone photo, and a data set of larger photos raises the key.
inline constexpr int64_t kDefaultMaxPixels = int64_t{1} << 24;

// Decodes the PNG or JPEG file at `path`. With `channels` 1 or 3 the result has that many
// (RGB to grey by ITU-R BT.601 luma, grey to RGB by copying); 0 keeps the file's own. An image
// whose header states more than `max_pixels` pixels is refused (InvalidArgument naming the
// file, its size and data.max_pixels) after the header is read and before any pixel is
// allocated.
Image decode_image_file(const std::string& path, int64_t channels = 0,
                        int64_t max_pixels = kDefaultMaxPixels);

// The same from bytes already in memory; `name` is what messages call them.
Image decode_image(const std::string& bytes, const std::string& name, int64_t channels = 0,
                   int64_t max_pixels = kDefaultMaxPixels);

// What a file's first bytes say about it, without decoding its pixels.
struct ImageInfo {
  int64_t height = 0;
  int64_t width = 0;
  bool png = false;  // else JPEG
};

// The cheap check an image folder runs on every file when it is listed: reads the first bytes
// (for a JPEG up to the frame header, at most 64 KiB) and, for a PNG, the last 12 (the IEND
// chunk every complete PNG ends with, so a truncated file is caught too; a PNG that does not end
// so, truncated or with bytes after IEND, is decoded whole to tell). InvalidArgument as
// decode_image_file's, "image 'PATH' cannot be read: ...", for a file that cannot be opened, is
// neither PNG nor JPEG, or whose header is cut short, malformed (a PNG's IHDR with a bad CRC,
// a bit depth or colour type PNG does not have) or gives a zero size: each a file the decoder
// refuses too; and a size of more than `max_pixels` pixels (as decode_image_file, checked before
// a PNG without its IEND trailer is decoded). A file that passes may still fail to decode
// (damaged pixel data, or a JPEG whose frame header lies beyond the first 64 KiB, whose size
// only the decoder checks): decode_image_file is the full check.
ImageInfo probe_image_file(const std::string& path, int64_t max_pixels = kDefaultMaxPixels);

// Pixels as float32 [channels, height, width] scaled to [0, 1], resized with bilinear
// interpolation (pixel centres aligned, as torch's interpolate with align_corners=false and
// PIL's bilinear without antialiasing) when height x width differs from the image's. Resizing
// to the image's own size returns the pixels exactly (v / 255).
at::Tensor image_to_tensor(const Image& image, int64_t height, int64_t width);

}  // namespace krab::data
