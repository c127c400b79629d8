#include "data/idx.h"

#include <torch/torch.h>
#include <zlib.h>

#include <cstring>
#include <filesystem>
#include <memory>

#include "core/errors.h"

namespace krab::data {
namespace {

// Header sizes we accept: 1..4 dimensions. Anything larger is not an image/label file and is
// far more likely a corrupt byte than a real 5-D array.
constexpr int kMaxDims = 4;
// A corrupt header can claim petabytes; refuse before reading rather than after exhausting
// memory. 16 GiB is far above any IDX dataset in use.
constexpr uint64_t kMaxPayload = uint64_t{16} << 30;
constexpr unsigned kChunk = 1u << 20;
// What a gzip file may expand to: its size times kMaxExpansion, or kSmallPayload when that is
// more. Deflate reaches about 1000:1 on constant bytes, so a 16 MB file of zeros could state
// (and deliver) the whole kMaxPayload, and the loader then makes floats of it, 4 bytes each.
// Image and label sets compress 2-5x (Fashion-MNIST 1.8x, MNIST 4.7x); 32x leaves room for
// mostly blank images, and kSmallPayload for the tiny files of tests.
constexpr uint64_t kMaxExpansion = 32;
constexpr uint64_t kSmallPayload = uint64_t{16} << 20;

struct GzCloser {
  void operator()(gzFile_s* f) const { gzclose(f); }
};
using GzFile = std::unique_ptr<gzFile_s, GzCloser>;

// gzread reports a damaged stream through gzerror, and a truncated gzip member only as a short
// read followed by Z_BUF_ERROR; a short read from a plain file is just the end of the file.
// Either way the caller decides "truncated" from the byte count; this only surfaces a damaged
// stream with zlib's own words.
void check_stream(gzFile f, const std::string& path) {
  int err = Z_OK;
  const char* msg = gzerror(f, &err);
  if (err != Z_OK && err != Z_STREAM_END) {
    const char* what = err == Z_BUF_ERROR ? "truncated gzip stream" : "damaged gzip stream";
    throw CorruptData(str_cat("'", path, "': ", what, " (zlib: ", msg, ")"));
  }
}

// Reads up to `n` bytes; returns how many arrived. Loops because gzread takes an unsigned int.
uint64_t read_bytes(gzFile f, const std::string& path, uint8_t* out, uint64_t n) {
  uint64_t got = 0;
  while (got < n) {
    const unsigned want = static_cast<unsigned>(std::min<uint64_t>(n - got, kChunk));
    const int r = gzread(f, out + got, want);
    if (r < 0) check_stream(f, path);
    if (r <= 0) break;
    got += static_cast<uint64_t>(r);
  }
  check_stream(f, path);
  return got;
}

uint32_t big_endian(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

}  // namespace

at::Tensor read_idx(const std::string& path, uint32_t expected_magic) {
  GzFile file(gzopen(path.c_str(), "rb"));
  KRAB_CHECK_ARG(file != nullptr, "cannot open IDX file '", path, "'");
  gzbuffer(file.get(), 1u << 17);

  uint8_t magic_bytes[4];
  if (read_bytes(file.get(), path, magic_bytes, 4) != 4) {
    throw CorruptData(str_cat("'", path, "': truncated: shorter than the 4-byte IDX magic number"));
  }
  const uint32_t magic = big_endian(magic_bytes);
  if (magic != expected_magic) {
    throw CorruptData(str_cat("'", path, "': bad magic number ", magic, " (expected ",
                              expected_magic, "); not an IDX file of the expected kind"));
  }
  // The magic's low byte is the dimension count, so a matching magic already fixes it.
  const int ndims = magic_bytes[3];
  KRAB_CHECK(ndims >= 1 && ndims <= kMaxDims, "IDX magic with ", ndims, " dimensions");

  uint8_t dim_bytes[4 * kMaxDims];
  if (read_bytes(file.get(), path, dim_bytes, 4 * ndims) != uint64_t(4 * ndims)) {
    throw CorruptData(str_cat("'", path, "': truncated: header ends inside the dimension sizes"));
  }
  std::vector<int64_t> dims(ndims);
  uint64_t payload = 1;
  for (int i = 0; i < ndims; ++i) {
    dims[i] = big_endian(dim_bytes + 4 * i);
    if (dims[i] == 0) throw CorruptData(str_cat("'", path, "': dimension ", i, " is zero"));
    // Checked before multiplying: payload <= 2^34 times a factor < 2^32 can pass 2^64, and a
    // wrapped product ([2^17, 2^17, 2^30] gives 0) would pass a check made afterwards.
    if (payload > kMaxPayload / static_cast<uint64_t>(dims[i])) {
      throw CorruptData(str_cat("'", path, "': header claims an implausible payload (over ",
                                kMaxPayload, " bytes)"));
    }
    payload *= static_cast<uint64_t>(dims[i]);
  }

  // The payload against the file's size, before reading it: what a plain file holds after its
  // header, or what a gzip file of that size can plausibly expand to.
  std::error_code ec;
  const uint64_t file_bytes = std::filesystem::file_size(path, ec);
  const uint64_t header = 4 + 4 * static_cast<uint64_t>(ndims);
  if (!ec && gzdirect(file.get()) && payload > file_bytes - std::min(file_bytes, header)) {
    throw CorruptData(str_cat("'", path, "': truncated: header promises ", payload,
                              " bytes of data, file holds ",
                              file_bytes - std::min(file_bytes, header)));
  }
  if (!ec && !gzdirect(file.get()) &&
      payload > std::max(kSmallPayload, kMaxExpansion * file_bytes)) {
    throw CorruptData(str_cat("'", path, "': header states ", payload, " bytes of data, more than ",
                              kMaxExpansion, " times the ", file_bytes,
                              " bytes of the gzip file (image and label sets compress 2-5x)"));
  }

  // Allocate the tensor only after the bytes have arrived: a corrupt header on a small file
  // then costs at most the file's real size, not what the header claims.
  std::vector<uint8_t> bytes;
  uint64_t got = 0;
  while (got < payload) {
    const uint64_t want = std::min<uint64_t>(payload - got, kChunk);
    bytes.resize(got + want);
    const uint64_t r = read_bytes(file.get(), path, bytes.data() + got, want);
    got += r;
    if (r < want) break;
  }
  if (got < payload) {
    throw CorruptData(str_cat("'", path, "': truncated: header promises ", payload,
                              " bytes of data, file holds ", got));
  }
  uint8_t extra;
  if (read_bytes(file.get(), path, &extra, 1) != 0) {
    throw CorruptData(
        str_cat("'", path, "': trailing bytes after the ", payload, " bytes the header describes"));
  }

  at::Tensor out = torch::empty(dims, torch::kUInt8);
  std::memcpy(out.data_ptr<uint8_t>(), bytes.data(), payload);
  return out;
}

}  // namespace krab::data
