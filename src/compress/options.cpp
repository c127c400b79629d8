#include "compress/options.h"

#include <algorithm>

#include "core/config.h"
#include "core/errors.h"

namespace krab::compress {
namespace {

const std::vector<std::string>& rotation_names() {
  static const std::vector<std::string> names{"none", "hadamard"};
  return names;
}

bool is_sparse(CompressorKind k) {
  return k == CompressorKind::kTopK || k == CompressorKind::kRandomK;
}

bool is_chunked(CompressorKind k) {
  return k == CompressorKind::kInt8 || k == CompressorKind::kOneBit;
}

// The checks that cross layers: comm.* against sync.* and train.optimizer.*.
void check_against_job(const CompressionOptions& o, const core::Config& c) {
  const std::string& name = kind_name(o.kind);
  if (o.automatic) {
    KRAB_CHECK_ARG(c.get_string("sync.mode") == "sync",
                   "comm.compression 'auto' picks the compression of sync.mode 'sync''s gradients; "
                   "sync.mode '",
                   c.get_string("sync.mode"), "' does not average gradients");
    KRAB_CHECK_ARG(c.get_int("parallel.zero_stage") == 0,
                   "comm.compression 'auto' is built for parallel.zero_stage 0 (data "
                   "parallelism's all-reduce); parallel.zero_stage ",
                   c.get_int("parallel.zero_stage"), " takes a compressor by name");
  }
  KRAB_CHECK_ARG(o.kind == CompressorKind::kNone || c.get_string("sync.mode") == "sync",
                 "comm.compression '", name,
                 "' compresses the gradients of sync.mode 'sync'; sync.mode '",
                 c.get_string("sync.mode"), "' does not average gradients");
  KRAB_CHECK_ARG(!c.is_set("comm.fold_momentum") || !c.get_bool("comm.fold_momentum") ||
                     o.kind == CompressorKind::kRandomK,
                 "comm.fold_momentum: true is for comm.compression 'randomk' (whose error feedback "
                 "acts as momentum), not '",
                 name, "'");
  if (o.momentum > 0 && c.get_string("train.optimizer.name") == "sgd")
    KRAB_CHECK_ARG(c.get_float("train.optimizer.momentum") == 0, "comm.momentum_correction ",
                   o.momentum, " with train.optimizer.momentum ",
                   c.get_float("train.optimizer.momentum"),
                   " would apply momentum twice; set train.optimizer.momentum: 0");
}

}  // namespace

const std::vector<std::string>& compressor_names() {
  static const std::vector<std::string> names{"fp16", "bf16",    "int8",    "onebit",
                                              "topk", "randomk", "powersgd"};
  return names;
}

const std::string& kind_name(CompressorKind kind) {
  static const std::string none = "none";
  if (kind == CompressorKind::kNone) return none;
  return compressor_names()[static_cast<size_t>(kind) - 1];
}

CompressorKind parse_compressor(const std::string& name) {
  if (name == "none") return CompressorKind::kNone;
  const auto& names = compressor_names();
  const auto it = std::find(names.begin(), names.end(), name);
  if (it == names.end()) {
    std::string all = "none";
    for (const auto& n : names) all += ", " + n;
    throw InvalidArgument(
        str_cat("comm.compression: unknown compressor '", name, "' (choose one of ", all, ")"));
  }
  return static_cast<CompressorKind>(1 + (it - names.begin()));
}

const std::string& rotation_name(Rotation rotation) {
  return rotation_names()[static_cast<size_t>(rotation)];
}

Rotation parse_rotation(const std::string& name) {
  KRAB_CHECK_ARG(name == "none" || name == "hadamard", "comm.rotation: unknown rotation '", name,
                 "' (choose one of none, hadamard)");
  return name == "none" ? Rotation::kNone : Rotation::kHadamard;
}

void validate(const CompressionOptions& o) {
  if (o.kind == CompressorKind::kNone) return;
  const std::string& name = kind_name(o.kind);
  if (is_sparse(o.kind))
    KRAB_CHECK_ARG(o.ratio > 0 && o.ratio <= 1, "comm.ratio must be in (0, 1] for ", name, ", got ",
                   o.ratio);
  if (o.kind == CompressorKind::kPowerSgd)
    KRAB_CHECK_ARG(o.rank >= 1, "comm.rank must be >= 1 for powersgd, got ", o.rank);
  if (is_chunked(o.kind))
    KRAB_CHECK_ARG(o.chunk == 0 || o.chunk >= 8,
                   "comm.chunk must be 0 (the codec's default) or >= 8 for ", name, ", got ",
                   o.chunk);
  const bool rotated = o.rotation == Rotation::kHadamard;
  KRAB_CHECK_ARG(!rotated || o.kind == CompressorKind::kOneBit, "comm.rotation '",
                 rotation_name(o.rotation), "' applies to onebit only, not to comm.compression '",
                 name, "'");
  if (rotated)
    KRAB_CHECK_ARG(o.chunk == 0 || (o.chunk & (o.chunk - 1)) == 0,
                   "comm.chunk must be a power of 2 for onebit with comm.rotation hadamard, got ",
                   o.chunk);
  KRAB_CHECK_ARG(o.warmup_steps >= 0, "comm.compress_warmup_steps must be >= 0, got ",
                 o.warmup_steps);
  KRAB_CHECK_ARG(o.min_numel >= 0, "comm.compress_min_numel must be >= 0, got ", o.min_numel);
  KRAB_CHECK_ARG(o.momentum >= 0 && o.momentum < 1,
                 "comm.momentum_correction must be in [0, 1), got ", o.momentum);
  KRAB_CHECK_ARG(o.clip_norm >= 0, "comm.clip_norm must be >= 0, got ", o.clip_norm);
}

CompressionOptions CompressionOptions::from_config(const core::Config& c) {
  CompressionOptions o;
  const std::string& name = c.get_string("comm.compression");
  o.automatic = name == "auto";
  o.kind = o.automatic ? CompressorKind::kNone : parse_compressor(name);
  o.ratio = c.get_float("comm.ratio");
  o.rank = c.get_int("comm.rank");
  o.chunk = c.get_int("comm.chunk");
  // The key's default (hadamard) is onebit's; other compressors take it only when it is named.
  if (o.kind == CompressorKind::kOneBit || c.is_set("comm.rotation"))
    o.rotation = parse_rotation(c.get_string("comm.rotation"));
  o.error_feedback = c.get_bool("comm.error_feedback");
  o.warmup_steps = c.get_int("comm.compress_warmup_steps");
  o.min_numel = c.get_int("comm.compress_min_numel");
  o.momentum = c.get_float("comm.momentum_correction");
  o.clip_norm = c.get_float("comm.clip_norm");
  o.seed = static_cast<uint64_t>(c.get_int("train.seed"));
  validate(o);
  check_against_job(o, c);
  return o;
}

}  // namespace krab::compress
