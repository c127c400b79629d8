// Reader for IDX files, the format MNIST and Fashion-MNIST ship in.
//
// An IDX file is a big-endian header followed by a dense array:
//
//   bytes 0-1   zero
//   byte  2     element type (0x08 = unsigned byte, the only type krab reads)
//   byte  3     number of dimensions d (1..4 accepted here)
//   then d      uint32 dimension sizes
//   then        prod(dims) elements, row-major
//
// The first four bytes read as one big-endian integer are the "magic number": 2049 for a
// one-dimensional ubyte file (labels), 2051 for a three-dimensional one (images).
//
// The file may be gzip-compressed or plain; zlib reads both through the same calls, so the
// reader does not look at the name. The whole payload is read into memory.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace krab::data {

inline constexpr uint32_t kIdxLabelsMagic = 2049;  // ubyte, 1 dimension
inline constexpr uint32_t kIdxImagesMagic = 2051;  // ubyte, 3 dimensions

// Reads the IDX file at `path` and checks that its magic number is `expected_magic`. Returns a
// uint8 tensor whose shape is the file's dimensions.
//
// Throws CorruptData naming `path` when: the header is short, the magic differs, a dimension is
// zero, the payload is shorter than the header promises (truncated) or longer (trailing bytes),
// or the gzip stream is damaged. The size the header states is checked against the file's before
// any of the payload is read: a plain file must hold it; a gzip file may expand at most 32 times
// (or to 16 MiB), far above what image data compresses to, so that a small file cannot state
// (and deliver, deflate reaches 1000:1) gigabytes. Throws InvalidArgument naming `path` when it
// cannot be opened.
at::Tensor read_idx(const std::string& path, uint32_t expected_magic);

}  // namespace krab::data
