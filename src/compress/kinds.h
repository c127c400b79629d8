// The concrete compressors, for make_compressor() (compressor.cpp) only: callers pick them by
// CompressorKind. Each takes validated options of its kind.
#pragma once

#include <memory>

#include "compress/compressor.h"

namespace krab::compress {

// fp16, bf16, int8, onebit (codec_compressor.cpp).
std::unique_ptr<Compressor> make_codec_compressor(const CompressionOptions& options);
// sparse.cpp.
std::unique_ptr<Compressor> make_topk(const CompressionOptions& options);
std::unique_ptr<Compressor> make_randomk(const CompressionOptions& options);
// powersgd.cpp.
std::unique_ptr<Compressor> make_powersgd(const CompressionOptions& options);

}  // namespace krab::compress
