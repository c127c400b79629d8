// ShardedCompression: gradient compression through ZeRO's reduce-scatter
// (docs/design/zero-sharding.md §2.2), for the codecs whose payload splits by rank
// (compress::Aggregation::kReencode): fp16, bf16, int8 and onebit.
//
// Stage 0 compresses a bucket in four moves: every worker encodes its value in W pieces
// (all-to-all: piece j to worker j), worker j averages the pieces it received and re-encodes
// the average (second-level error feedback), an all-gather hands every worker every averaged
// piece, and each decodes all of them. A ZeRO rank needs only its own averaged piece, so here
// the all-gather and the full decode are replaced by Compressor::decode_piece of the piece this
// rank re-encoded: half the compressed traffic.
//
// That works because piece j is laid out to be exactly rank j's part of the bucket. A bucket's
// rank-major buffer (grad_reducer.h) holds segment j = rank j's chunk of each of its units;
// its elements are split the way stage 0's CompressionHook splits them, by parameter:
//   large  elements of parameters the compressor finds worth compressing (compressible(shape)
//          of the whole parameter, so the same parameters are compressed as at stage 0);
//   small  the others, and the padding.
// The large elements of segment j are packed into piece j of one compressor stream of W · P
// values (P = the most large elements any segment has, the rest zeros); the small ones into a
// rank-major fp32 buffer of W · Q values that is reduce-scattered (averaged) as usual. Each
// element is then averaged over the workers in rank order with its own error-feedback
// residuals, exactly as at stage 0: on two workers without gradient accumulation the averaged
// gradients of fp16 and bf16 (element-wise) are bit-identical to stage 0 with the same codec.
// int8 and onebit quantize in chunks (comm.chunk values share a scale; int8 rounds with a
// random draw per chunk): P is rounded up to whole chunks, so that piece j is rank j's values
// and no chunk mixes two ranks' values. Their chunks hold other values than stage 0's (which
// cuts the bucket's stream evenly, not by rank), so they approximate the uncompressed run as
// well as stage 0 with the codec does, not bit for bit.
//
// comm.compress_warmup_steps: the first steps reduce-scatter the whole buffer in fp32, as stage
// 0 all-reduces it. Memory: the compressor's first-level residual is full size (each worker's
// own rounding error of all it sends), the second-level one a shard.
//
// Thread safety: the training thread only (one driver per Compressor).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "compress/compressor.h"
#include "engine/shard_layout.h"
#include "parallel/zero/grad_reducer.h"

namespace krab::parallel::zero {

class ShardedCompression {
 public:
  // Plans every bucket of `plan` for this `rank`. InvalidArgument naming comm.compression for a
  // compressor other than fp16, bf16, int8 or onebit (topk, randomk and powersgd cannot split
  // their payload by rank: shared positions, sparse indices, low-rank factors).
  ShardedCompression(const engine::ShardLayout& layout, const ZeroBucketPlan& plan, int rank,
                     std::unique_ptr<compress::Compressor> compressor);
  ~ShardedCompression();

  std::string name() const;

  // Starts the averaging of bucket `bucket`'s rank-major buffer `input` (W · L values) into
  // this rank's segment `output` (L values), optimizer step `step` (counted from 0). The
  // buffers must stay alive until the returned Work's wait() returned; the Work's wait() runs
  // the rest of the protocol (re-encode, decode, error feedback).
  comm::WorkPtr reduce(comm::Communicator& comm, int bucket, const at::Tensor& input,
                       const at::Tensor& output, int64_t step);

 private:
  // A contiguous run: `length` values from `from` to `to`.
  struct Run {
    int64_t from, to, length;
  };
  struct BucketSplit {
    int64_t large = 0, small = 0;  // P and Q: values per rank in the piece and in the fp32 part
    std::vector<Run> pack_large;   // buffer -> the compressor stream (all ranks' segments)
    std::vector<Run> pack_small;   // buffer -> the fp32 rank-major buffer
    std::vector<Run> own_large;    // this rank's piece -> its output segment
    std::vector<Run> own_small;    // this rank's fp32 shard -> its output segment
  };
  BucketSplit split(const engine::ShardLayout& layout, const ZeroBucket& bucket, int world,
                    int rank) const;

  std::unique_ptr<compress::Compressor> compressor_;
  int64_t chunk_ = 1;  // the codec's chunk: 1 (fp16, bf16) or comm.chunk (int8, onebit)
  std::vector<BucketSplit> splits_;
};

}  // namespace krab::parallel::zero
