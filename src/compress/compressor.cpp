#include "compress/compressor.h"

#include <torch/torch.h>

#include "compress/kinds.h"
#include "core/errors.h"

namespace krab::compress {

bool Compressor::compressible(const std::vector<int64_t>& shape) const {
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  return numel >= options_.min_numel;
}

void Compressor::setup(const std::vector<std::vector<Segment>>& streams) {
  streams_.clear();
  streams_.resize(streams.size());
  for (size_t i = 0; i < streams.size(); ++i) {
    Stream& s = streams_[i];
    s.segments = streams[i];
    for (const Segment& seg : s.segments) s.numel += seg.numel;
    s.residual = torch::zeros({s.numel});
    s.sent = torch::zeros({s.numel});
    setup_stream(s, static_cast<int64_t>(i));
  }
}

Compressor::Stream& Compressor::stream(const Context& ctx) {
  KRAB_CHECK(ctx.stream >= 0 && ctx.stream < static_cast<int64_t>(streams_.size()),
             "compressor: stream ", ctx.stream, " was not set up");
  return streams_[ctx.stream];
}

void Compressor::begin(const Context& ctx, at::Tensor& x) {
  Stream& s = stream(ctx);
  if (!options_.error_feedback) return;
  x.add_(s.residual);
  s.input = x.clone();
}

at::Tensor Compressor::reencode(const Context&, const at::Tensor&) {
  KRAB_CHECK(false, "compressor ", kind_name(options_.kind), " has no re-encoding step");
  return {};
}

void Compressor::decode_piece(const Context&, int64_t, const at::Tensor&, at::Tensor&) {
  KRAB_CHECK(false, "compressor ", kind_name(options_.kind), " cannot decode a single piece");
}

void Compressor::end(const Context& ctx) {
  Stream& s = stream(ctx);
  if (!s.input.defined()) return;
  at::sub_out(s.residual, s.input, s.sent);
  s.input = at::Tensor();
}

std::unique_ptr<Compressor> make_compressor(const CompressionOptions& o) {
  validate(o);
  switch (o.kind) {
    case CompressorKind::kNone:
      return nullptr;
    case CompressorKind::kTopK:
      return make_topk(o);
    case CompressorKind::kRandomK:
      return make_randomk(o);
    case CompressorKind::kPowerSgd:
      return make_powersgd(o);
    default:
      return make_codec_compressor(o);
  }
}

}  // namespace krab::compress
