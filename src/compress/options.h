// CompressionOptions: which gradient compressor, and its knobs, as typed values.
//
// Strings exist only at the edge: from_config() reads the comm.* keys (and the few keys of other
// layers a compressor must agree with), parses names into enums and checks every value, so what
// gets past it is a valid, typed set of options. Adding a compressor means a name in the config
// registry's choices (core/config_keys.cpp) and, here in compress/, a CompressorKind, its name
// in kind_names() and a Compressor (compressor.h); nothing above compress/ changes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace krab::core {
class Config;
}

namespace krab::compress {

enum class CompressorKind { kNone, kFp16, kBf16, kInt8, kOneBit, kTopK, kRandomK, kPowerSgd };

// onebit only: what the signs are taken of (see codecs.h).
enum class Rotation { kNone, kHadamard };

struct CompressionOptions {
  CompressorKind kind = CompressorKind::kNone;
  // comm.compression: auto (parallel/auto_compression.h): the run picks among none, fp16,
  // powersgd and topk as it measures its communication; `kind` is kNone until it does, and the
  // other fields are the candidates' knobs. Only data parallelism's hook acts on it.
  bool automatic = false;
  double ratio = 0.01;                  // topk, randomk: fraction of values sent, in (0, 1]
  int64_t rank = 4;                     // powersgd
  int64_t chunk = 0;                    // int8, onebit: values per scale (0: 256 for both)
  Rotation rotation = Rotation::kNone;  // onebit: rotate each chunk before the sign
  int64_t warmup_steps = 0;             // plain fp32 steps first
  int64_t min_numel = 1024;             // smaller parameters go uncompressed
  bool error_feedback = true;
  double momentum = 0;   // momentum correction factor, in [0, 1) (0 = off)
  double clip_norm = 0;  // local gradient clipping of the compressed part (0 = off)
  uint64_t seed = 0;     // random-k positions, stochastic rounding, PowerSGD's first Q

  // What a job's config asks for: comm.compression, comm.ratio, comm.rank, comm.chunk,
  // comm.rotation (its default, hadamard, is onebit's; other compressors take it only when the
  // key is set), comm.error_feedback, comm.compress_warmup_steps, comm.compress_min_numel,
  // comm.momentum_correction, comm.clip_norm and train.seed. Checks them (validate()) and how
  // they sit with sync.mode, comm.fold_momentum and train.optimizer.*; throws
  // krab::InvalidArgument naming the key at fault.
  static CompressionOptions from_config(const core::Config& config);
};

// The names comm.compression accepts (without "none"), in CompressorKind order.
const std::vector<std::string>& compressor_names();

// "none", "fp16", ...: the config's spelling of a kind, and back ("auto" is not a kind:
// from_config reads it). parse_compressor throws krab::InvalidArgument naming
// comm.compression and listing the known names.
const std::string& kind_name(CompressorKind kind);
CompressorKind parse_compressor(const std::string& name);

// "none" | "hadamard"; parse_rotation throws krab::InvalidArgument naming comm.rotation.
const std::string& rotation_name(Rotation rotation);
Rotation parse_rotation(const std::string& name);

// Throws krab::InvalidArgument naming the comm.* key at fault.
void validate(const CompressionOptions& options);

}  // namespace krab::compress
