#include "data/image_codec.h"

#include <fcntl.h>
#include <jpeglib.h>
#include <png.h>
#include <sys/stat.h>
#include <torch/torch.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <system_error>

#include "core/errors.h"

namespace krab::data {
namespace {

bool is_png(const std::string& b) {
  static const unsigned char kMagic[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  return b.size() >= 8 && std::memcmp(b.data(), kMagic, 8) == 0;
}

bool is_jpeg(const std::string& b) {
  return b.size() >= 3 && static_cast<unsigned char>(b[0]) == 0xFF &&
         static_cast<unsigned char>(b[1]) == 0xD8 && static_cast<unsigned char>(b[2]) == 0xFF;
}

[[noreturn]] void unreadable(const std::string& name, const std::string& why) {
  throw InvalidArgument(str_cat("image '", name, "' cannot be read: ", why));
}

// A header's size against the pixel limit, before anything that size is allocated: decoding
// allocates height x width x channels bytes (and libjpeg a coefficient buffer as large for a
// progressive file) whatever the file's length, so a 69-byte PNG stating 65535 x 65535 cost
// 4.4 GB. The product is taken in 64 bits: both factors are below 2^32.
void check_pixels(const std::string& name, uint64_t height, uint64_t width, int64_t max_pixels) {
  if (height * width > static_cast<uint64_t>(max_pixels))
    throw InvalidArgument(str_cat("image '", name, "': its header states ", height, "x", width,
                                  " = ", height * width, " pixels, more than data.max_pixels (",
                                  max_pixels, ")"));
}

// The simplified API keeps libpng's state in `img` and frees it on every failure path; the
// caller only frees after a successful begin that is not followed by finish_read.
Image decode_png(const std::string& bytes, const std::string& name, int64_t max_pixels) {
  png_image img;
  std::memset(&img, 0, sizeof(img));
  img.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_memory(&img, bytes.data(), bytes.size()))
    unreadable(name, str_cat("PNG: ", img.message));
  if (uint64_t{img.height} * img.width > static_cast<uint64_t>(max_pixels)) {
    png_image_free(&img);
    check_pixels(name, img.height, img.width, max_pixels);
  }
  const bool color = (img.format & PNG_FORMAT_FLAG_COLOR) != 0;
  img.format = color ? PNG_FORMAT_RGB : PNG_FORMAT_GRAY;
  Image out;
  out.height = img.height;
  out.width = img.width;
  out.channels = color ? 3 : 1;
  // Zeroed, so an alpha channel is composited onto black (background == nullptr).
  out.pixels.assign(PNG_IMAGE_SIZE(img), 0);
  if (!png_image_finish_read(&img, nullptr, out.pixels.data(), 0, nullptr))
    unreadable(name, str_cat("PNG: ", img.message));
  return out;
}

// libjpeg reports errors through a callback that must not return: it longjmps back to
// decode_jpeg with the message saved. No object with a destructor is created between setjmp
// and the calls that may jump.
struct JpegError {
  jpeg_error_mgr mgr;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

void on_jpeg_error(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<JpegError*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

void on_jpeg_message(j_common_ptr, int) {}  // warnings (corrupt but decodable data) are silent

Image decode_jpeg(const std::string& bytes, const std::string& name, int64_t max_pixels) {
  jpeg_decompress_struct cinfo;
  JpegError err;
  cinfo.err = jpeg_std_error(&err.mgr);
  err.mgr.error_exit = on_jpeg_error;
  err.mgr.emit_message = on_jpeg_message;
  Image out;
  if (setjmp(err.jump)) {
    jpeg_destroy_decompress(&cinfo);
    unreadable(name, str_cat("JPEG: ", err.message));
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size());
  jpeg_read_header(&cinfo, TRUE);
  const uint64_t height = cinfo.image_height, width = cinfo.image_width;
  if (height * width > static_cast<uint64_t>(max_pixels)) {
    jpeg_destroy_decompress(&cinfo);  // before the throw: no longjmp can come after it
    check_pixels(name, height, width, max_pixels);
  }
  const bool grey = cinfo.jpeg_color_space == JCS_GRAYSCALE;
  cinfo.out_color_space = grey ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_start_decompress(&cinfo);
  out.height = cinfo.output_height;
  out.width = cinfo.output_width;
  out.channels = cinfo.output_components;
  out.pixels.resize(static_cast<size_t>(out.height * out.width * out.channels));
  const size_t stride = static_cast<size_t>(out.width * out.channels);
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW row = out.pixels.data() + cinfo.output_scanline * stride;
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  return out;
}

Image convert_channels(Image in, int64_t channels) {
  if (channels == 0 || channels == in.channels) return in;
  const int64_t n = in.height * in.width;
  Image out{in.height, in.width, channels, std::vector<uint8_t>(n * channels)};
  const uint8_t* p = in.pixels.data();
  uint8_t* q = out.pixels.data();
  if (channels == 3) {
    for (int64_t i = 0; i < n; ++i) q[3 * i] = q[3 * i + 1] = q[3 * i + 2] = p[i];
  } else {
    // BT.601 luma, rounded: what libjpeg and PIL use for RGB -> L.
    for (int64_t i = 0; i < n; ++i)
      q[i] = static_cast<uint8_t>((299 * p[3 * i] + 587 * p[3 * i + 1] + 114 * p[3 * i + 2] + 500) /
                                  1000);
  }
  return out;
}

// Source coordinate of destination pixel `d` for a scale of src/dst, centres aligned, clamped
// to the image: the two neighbours and the weight of the second.
struct Tap {
  int64_t lo, hi;
  float w;
};

std::vector<Tap> taps(int64_t src, int64_t dst) {
  std::vector<Tap> out(dst);
  const double scale = static_cast<double>(src) / dst;
  for (int64_t d = 0; d < dst; ++d) {
    double s = (d + 0.5) * scale - 0.5;
    if (s < 0) s = 0;
    const int64_t lo = std::min<int64_t>(static_cast<int64_t>(s), src - 1);
    out[d] = {lo, std::min<int64_t>(lo + 1, src - 1), static_cast<float>(s - lo)};
  }
  return out;
}

uint32_t big_endian(const std::string& b, size_t at, int bytes) {
  uint32_t v = 0;
  for (int k = 0; k < bytes; ++k) v = (v << 8) | static_cast<unsigned char>(b[at + k]);
  return v;
}

// An image file open for reading. Listing names every entry that looks like an image, and this
// is where it turns out whether it is one: anything but a regular file (a symbolic link to
// nothing, a FIFO, a device, a socket) is unreadable like a damaged file, so one rule (named, or
// skipped with data.skip_bad) covers them all. Opened with O_NONBLOCK and checked with fstat on
// the open descriptor, not stat before open: a FIFO planted under an image's name can neither
// block a decoding thread in open() nor be swapped in between the check and the read. Symbolic
// links to files are followed, as torchvision's ImageFolder follows them.
class ImageFile {
 public:
  explicit ImageFile(const std::string& path)
      : fd_(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC)) {
    if (fd_ < 0) {
      const int err = errno;
      struct stat link {};
      if (err == ENOENT && ::lstat(path.c_str(), &link) == 0 && S_ISLNK(link.st_mode))
        unreadable(path, "a symbolic link to a missing file");
      unreadable(
          path, "cannot open the file: " + std::error_code(err, std::generic_category()).message());
    }
    struct stat st {};
    if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd_);
      unreadable(path, "not a regular file (a FIFO, device or socket)");
    }
    size_ = st.st_size;
  }
  ~ImageFile() { ::close(fd_); }
  ImageFile(const ImageFile&) = delete;
  ImageFile& operator=(const ImageFile&) = delete;

  int64_t size() const { return size_; }

  // The bytes [offset, offset + count), fewer where the file ends first.
  std::string read_at(int64_t offset, size_t count) const {
    std::string out(count, '\0');
    size_t got = 0;
    while (got < count) {
      const ssize_t n =
          ::pread(fd_, out.data() + got, count - got, offset + static_cast<int64_t>(got));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
    out.resize(got);
    return out;
  }

 private:
  int fd_;
  int64_t size_ = 0;
};

// Signature, then IHDR (length 13, type, width, height, depth, colour type, three method bytes,
// CRC); a complete file ends with the 12 bytes of an empty IEND chunk. libpng ignores bytes
// after IEND, so a file that does not end so is decoded whole: only libpng can tell a truncated
// file from one with a trailer.
ImageInfo probe_png(const ImageFile& file, const std::string& head, const std::string& name,
                    int64_t max_pixels) {
  if (head.size() < 33) unreadable(name, "PNG: the file ends inside its header (truncated)");
  const uint32_t crc =
      static_cast<uint32_t>(crc32(0, reinterpret_cast<const Bytef*>(head.data() + 12), 17));
  if (big_endian(head, 8, 4) != 13 || head.compare(12, 4, "IHDR") != 0 ||
      big_endian(head, 29, 4) != crc)
    unreadable(name, "PNG: the header chunk (IHDR) is damaged");
  ImageInfo info{big_endian(head, 20, 4), big_endian(head, 16, 4), true};
  const int depth = static_cast<unsigned char>(head[24]),
            type = static_cast<unsigned char>(head[25]);
  if (info.height == 0 || info.width == 0 || info.height > 0x7fffffff || info.width > 0x7fffffff)
    unreadable(name, str_cat("PNG: the header gives a size of ", info.height, "x", info.width));
  if (depth < 1 || (depth & (depth - 1)) != 0 || depth > 16 ||
      (type != 0 && type != 2 && type != 3 && type != 4 && type != 6))
    unreadable(name, str_cat("PNG: bit depth ", depth, " and colour type ", type, " are invalid"));
  check_pixels(name, info.height, info.width, max_pixels);  // before the decode below
  const int64_t size = file.size();
  static const char kIend[12] = {0, 0, 0, 0, 'I', 'E', 'N', 'D', '\xae', 'B', '`', '\x82'};
  if (size >= 45 && file.read_at(size - 12, 12) == std::string(kIend, 12)) return info;
  decode_png(file.read_at(0, static_cast<size_t>(size)), name, max_pixels);
  return info;
}

// Walks the markers from SOI to the first frame header (SOF0..SOF15 but DHT, JPG and DAC) and
// reads the size there. What libjpeg only warns about (stray bytes between segments) and a frame
// header beyond the first 64 KiB are left to the decoder.
ImageInfo probe_jpeg(const std::string& head, const std::string& name, int64_t max_pixels) {
  size_t at = 2;
  while (at + 4 <= head.size()) {
    if (static_cast<unsigned char>(head[at]) != 0xFF) return {};
    const int marker = static_cast<unsigned char>(head[at + 1]);
    if (marker == 0xFF) {  // fill byte
      ++at;
      continue;
    }
    if (marker == 0xD9 || marker == 0xDA) unreadable(name, "JPEG: no frame header before the data");
    if (marker == 0x01 || (marker >= 0xD0 && marker <= 0xD7)) {  // no length
      at += 2;
      continue;
    }
    const size_t length = big_endian(head, at + 2, 2);
    const bool frame =
        marker >= 0xC0 && marker <= 0xCF && marker != 0xC4 && marker != 0xC8 && marker != 0xCC;
    if (frame) {
      if (length < 8 || at + 9 > head.size())
        unreadable(name, "JPEG: the frame header is cut short");
      ImageInfo info{big_endian(head, at + 5, 2), big_endian(head, at + 7, 2), false};
      if (info.height == 0 || info.width == 0)
        unreadable(name,
                   str_cat("JPEG: the header gives a size of ", info.height, "x", info.width));
      check_pixels(name, info.height, info.width, max_pixels);
      return info;
    }
    if (length < 2) unreadable(name, "JPEG: a header segment has a bad length");
    at += 2 + length;
  }
  if (head.size() < 64 * 1024)
    unreadable(name, "JPEG: the file ends inside its header (truncated)");
  return {};  // a frame header further on: left to the decoder
}

}  // namespace

ImageInfo probe_image_file(const std::string& path, int64_t max_pixels) {
  const ImageFile file(path);
  const std::string head = file.read_at(0, 33);
  if (is_png(head)) return probe_png(file, head, path, max_pixels);
  if (is_jpeg(head)) return probe_jpeg(file.read_at(0, 64 * 1024), path, max_pixels);
  unreadable(path, head.empty() ? "the file is empty" : "neither a PNG nor a JPEG file");
}

Image decode_image(const std::string& bytes, const std::string& name, int64_t channels,
                   int64_t max_pixels) {
  KRAB_CHECK_ARG(channels == 0 || channels == 1 || channels == 3,
                 "image channels must be 0, 1 "
                 "or 3, got ",
                 channels);
  KRAB_CHECK_ARG(max_pixels >= 1, "data.max_pixels must be >= 1, got ", max_pixels);
  if (is_png(bytes)) return convert_channels(decode_png(bytes, name, max_pixels), channels);
  if (is_jpeg(bytes)) return convert_channels(decode_jpeg(bytes, name, max_pixels), channels);
  unreadable(name, bytes.empty() ? "the file is empty" : "neither a PNG nor a JPEG file");
}

Image decode_image_file(const std::string& path, int64_t channels, int64_t max_pixels) {
  const ImageFile file(path);
  return decode_image(file.read_at(0, static_cast<size_t>(file.size())), path, channels,
                      max_pixels);
}

at::Tensor image_to_tensor(const Image& image, int64_t height, int64_t width) {
  KRAB_CHECK_ARG(height >= 1 && width >= 1, "image size must be at least 1x1, got ", height, "x",
                 width);
  const int64_t c = image.channels, h = image.height, w = image.width;
  auto out = torch::empty({c, height, width}, torch::kFloat32);
  float* q = out.data_ptr<float>();
  const uint8_t* p = image.pixels.data();
  const std::vector<Tap> ty = taps(h, height), tx = taps(w, width);
  for (int64_t y = 0; y < height; ++y) {
    const Tap& a = ty[y];
    for (int64_t x = 0; x < width; ++x) {
      const Tap& b = tx[x];
      for (int64_t k = 0; k < c; ++k) {
        const float v00 = p[(a.lo * w + b.lo) * c + k], v01 = p[(a.lo * w + b.hi) * c + k];
        const float v10 = p[(a.hi * w + b.lo) * c + k], v11 = p[(a.hi * w + b.hi) * c + k];
        const float top = v00 + (v01 - v00) * b.w, bottom = v10 + (v11 - v10) * b.w;
        q[(k * height + y) * width + x] = (top + (bottom - top) * a.w) / 255.0f;
      }
    }
  }
  return out;
}

}  // namespace krab::data
