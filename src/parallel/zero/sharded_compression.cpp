#include "parallel/zero/sharded_compression.h"

#include <torch/torch.h>

#include <algorithm>

#include "compress/options.h"
#include "core/errors.h"
#include "parallel/then_work.h"

namespace krab::parallel::zero {

namespace {

// The values a codec quantizes together (compress/codecs.h).
int64_t codec_chunk(const compress::CompressionOptions& o) {
  using compress::CompressorKind;
  if (o.kind == CompressorKind::kInt8 || o.kind == CompressorKind::kOneBit)
    return o.chunk > 0 ? o.chunk : 256;  // compress/codecs.h's default
  return 1;
}

}  // namespace

ShardedCompression::ShardedCompression(const engine::ShardLayout& layout,
                                       const ZeroBucketPlan& plan, int rank,
                                       std::unique_ptr<compress::Compressor> compressor)
    : compressor_(std::move(compressor)) {
  const auto kind = compressor_->options().kind;
  KRAB_CHECK_ARG(compressor_->aggregation() == compress::Aggregation::kReencode,
                 "comm.compression: ", compress::kind_name(kind),
                 " does not compose with parallel.zero_stage > 0 (fp16, bf16, int8 and onebit "
                 "do: their payload splits by rank)");
  chunk_ = codec_chunk(compressor_->options());
  std::vector<std::vector<compress::Segment>> streams;
  for (const ZeroBucket& bucket : plan.buckets) {
    splits_.push_back(split(layout, bucket, plan.world, rank));
    const int64_t n = splits_.back().large * plan.world;
    streams.push_back({compress::Segment{0, n, 1, n}});
  }
  compressor_->setup(streams);
}

ShardedCompression::~ShardedCompression() = default;

std::string ShardedCompression::name() const {
  return compress::kind_name(compressor_->options().kind);
}

// Walks segment j of the buffer (rank j's chunk of each unit) run by run: a parameter's piece
// is large or small by the parameter's shape; a gap between pieces is padding (small).
ShardedCompression::BucketSplit ShardedCompression::split(const engine::ShardLayout& layout,
                                                          const ZeroBucket& bucket, int world,
                                                          int rank) const {
  BucketSplit s;
  std::vector<std::vector<Run>> large(world), small(world);  // segment position -> packed
  std::vector<int64_t> n_large(world, 0), n_small(world, 0);
  for (int j = 0; j < world; ++j)
    for (size_t k = 0; k < bucket.units.size(); ++k) {
      const int u = bucket.units[k];
      const engine::Range chunk = layout.shard(u, j);
      const int64_t base = bucket.unit_offset[k] - chunk.begin;  // flat -> segment position
      auto add = [&](bool is_large, int64_t flat, int64_t len) {
        if (len <= 0) return;
        int64_t& n = is_large ? n_large[j] : n_small[j];
        (is_large ? large : small)[j].push_back({base + flat, n, len});
        n += len;
      };
      int64_t cursor = chunk.begin;
      for (const engine::Piece& p : layout.pieces(u, chunk)) {
        add(false, cursor, p.flat_offset - cursor);
        add(compressor_->compressible(layout.unit(u).params[p.param].shape), p.flat_offset,
            p.length);
        cursor = p.flat_offset + p.length;
      }
      add(false, cursor, chunk.end - cursor);
    }
  // Whole codec chunks per piece: the stream's W pieces (CodecCompressor's piece_numel) are
  // then exactly the W segments, and no int8/onebit chunk spans two ranks.
  const int64_t most = *std::max_element(n_large.begin(), n_large.end());
  s.large = (most + chunk_ - 1) / chunk_ * chunk_;
  s.small = *std::max_element(n_small.begin(), n_small.end());
  for (int j = 0; j < world; ++j) {
    for (const Run& r : large[j])
      s.pack_large.push_back({j * bucket.segment + r.from, j * s.large + r.to, r.length});
    for (const Run& r : small[j])
      s.pack_small.push_back({j * bucket.segment + r.from, j * s.small + r.to, r.length});
  }
  for (const Run& r : large[rank]) s.own_large.push_back({r.to, r.from, r.length});
  for (const Run& r : small[rank]) s.own_small.push_back({r.to, r.from, r.length});
  return s;
}

comm::WorkPtr ShardedCompression::reduce(comm::Communicator& comm, int bucket,
                                         const at::Tensor& input, const at::Tensor& output,
                                         int64_t step) {
  at::Tensor out = output;
  if (step < compressor_->options().warmup_steps)
    return comm.reduce_scatter(input, out, comm::ReduceOp::kAvg);
  const BucketSplit& s = splits_[bucket];
  // Nothing worth compressing (biases, norms): fp32, as stage 0 all-reduces such a bucket.
  if (s.large == 0) return comm.reduce_scatter(input, out, comm::ReduceOp::kAvg);
  const int world = comm.size();
  auto copy = [](const std::vector<Run>& runs, const at::Tensor& from, const at::Tensor& to) {
    for (const Run& r : runs) to.narrow(0, r.to, r.length).copy_(from.narrow(0, r.from, r.length));
  };
  torch::NoGradGuard no_grad;
  at::Tensor small_in = torch::zeros({world * s.small}), small_out = torch::empty({s.small});
  copy(s.pack_small, input, small_in);
  comm::WorkPtr small_work = comm.reduce_scatter(small_in, small_out, comm::ReduceOp::kAvg);
  at::Tensor x = torch::zeros({world * s.large});
  copy(s.pack_large, input, x);
  const compress::Context ctx{bucket, step, comm.rank(), world};
  compressor_->begin(ctx, x);
  const compress::Encoded e = compressor_->encode(ctx, 0, x);
  at::Tensor received = torch::empty_like(e.payload);
  comm::WorkPtr large_work = comm.alltoall(e.payload, received);
  return std::make_shared<ThenWork>(
      std::vector<comm::WorkPtr>{small_work, large_work},
      [this, ctx, &s, copy, out, small_in, small_out, x, received, payload = e.payload]() mutable {
        torch::NoGradGuard guard;
        at::Tensor piece = compressor_->reencode(ctx, received);
        at::Tensor mine = torch::empty({s.large});
        compressor_->decode_piece(ctx, 0, piece, mine);
        compressor_->end(ctx);
        copy(s.own_large, mine, out);
        copy(s.own_small, small_out, out);
      });
}

}  // namespace krab::parallel::zero
