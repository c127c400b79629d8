// Compressor: how a flat fp32 gradient is turned into small payloads, how the workers' payloads
// combine, and what is decoded from the result. No communication here: whoever moves the
// payloads (DataParallel's comm hook, parallel/compression_hook.h; a parameter server's pushes)
// drives a Compressor through the protocol below, so every layer compresses the same way.
//
// Streams. A Compressor keeps state per stream: one tensor that is compressed every step, laid
// out as a list of Segments (parameters; PowerSGD views each as a matrix). Error feedback is
// per stream: what a step did not send (the value minus what the others will decode of it) is
// kept and added to the next step's value, so nothing is lost, only late. For every worker:
// sum over steps of sent + current residual = sum of its values.
//
// One step of a stream, on every worker, with the same Context on every worker but its rank:
//   begin(ctx, x)                       x += residual (error feedback on)
//   for round in 0 .. rounds() - 1:
//     e = encode(ctx, round, x)          this worker's payload (and, sparse compressors, the
//                                        positions it sent)
//     combine the workers' payloads, as aggregation() says:
//       kSum       e.payload is fp32; replace it by the average over workers (an all-reduce);
//                  decode(ctx, round, averaged, x)
//       kGather    e.payload is bytes and does not add; gather every worker's, in rank order,
//                  into one tensor; decode(ctx, round, gathered, x)
//       kReencode  e.payload is bytes of an element-wise codec, cut into `world` pieces; piece j
//                  of every worker goes to worker j, who calls reencode(ctx, received) on them
//                  (rank order) and returns one piece; gather those pieces (rank order) into a
//                  payload-sized tensor; decode(ctx, round, gathered, x)
//   end(ctx)                            residual = (x after begin) - last_sent
// After the last decode, x holds the average over workers (or the compressor's approximation
// of it), bit-identical on every worker: each decodes the same bytes.
//
// The compressors (see docs/config.md, comm.compression):
//  * fp16, bf16, int8, onebit (kReencode; codecs.h): each worker's piece j goes to worker j,
//    which decodes, averages in fp32, adds its own second-level residual, encodes its averaged
//    piece again, and a gather of the encoded pieces gives every worker the average (two-level
//    error feedback as in DeepSpeed's 1-bit Adam). Bytes sent per worker with all-to-all and
//    all-gather: 2 (W-1)/W · encoded bytes, the ring all-reduce's share, so traffic / fp32 =
//    encoded size / 4 bytes per value. onebit takes its signs after a randomized Hadamard
//    rotation of each chunk by default (Rotation::kHadamard; see codecs.cpp): on the 2-epoch
//    CNN that is the difference between ending 3 points below plain sync and ending level.
//  * topk (kGather): per block of 65,536 values, the ceil(ratio · block) largest |values| of
//    the value + residual are sent as (uint16 index, fp16 value / block scale) pairs; sparse
//    payloads cannot be summed on the way, so all are gathered, decoded and averaged.
//  * randomk (kSum): ceil(ratio · n) positions drawn from a generator seeded with
//    (seed, step, stream) — the same positions on every worker, so the values are averaged
//    directly and no indices travel.
//  * powersgd (kSum, two rounds): each matrix M (a segment as rows x cols) is approximated as
//    P Qᵀ: P = M Q, average P, orthonormalise it, Q = Mᵀ P, average Q; Q is kept for the next
//    step (warm start). Only matrices with (rows + cols) · rank < rows · cols are worth it
//    (compressible()).
// topk and randomk report the positions they sent, so that a caller keeping a velocity (DGC's
// momentum correction) can clear it there (DGC's momentum factor masking).
//
// Thread safety: none; one driver per Compressor. Streams are independent, so several may be
// between begin() and end() at once (DataParallel starts bucket b+1 before waiting for b).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "compress/options.h"

namespace krab::compress {

// One parameter inside a stream's flat tensor.
struct Segment {
  int64_t offset = 0;  // in elements, in the stream
  int64_t numel = 0;
  int64_t rows = 1, cols = 0;  // matrix view (rows = shape[0]), for PowerSGD
};

// Who is compressing what, this step. Seeds derive from it, so it must agree across workers
// (all but `rank`).
struct Context {
  int64_t stream = 0;
  int64_t step = 0;  // counts optimizer steps from 0
  int rank = 0;
  int world = 1;
};

// How the payloads of the workers become one result (see the protocol above).
enum class Aggregation { kSum, kGather, kReencode };

struct Encoded {
  at::Tensor payload;    // fp32 for kSum, uint8 otherwise
  at::Tensor positions;  // int64 positions of x sent (topk, randomk); undefined for the rest
};

class Compressor {
 public:
  explicit Compressor(CompressionOptions options) : options_(std::move(options)) {}
  virtual ~Compressor() = default;

  const CompressionOptions& options() const { return options_; }
  virtual Aggregation aggregation() const = 0;
  // Whether payloads can be averaged on the way (all-reduced), or must be gathered.
  bool summable() const { return aggregation() == Aggregation::kSum; }
  // Encode/combine/decode rounds per step.
  virtual int64_t rounds() const { return 1; }
  // Whether a parameter of this shape is worth compressing; the caller sends the others
  // uncompressed. Default: numel >= options().min_numel.
  virtual bool compressible(const std::vector<int64_t>& shape) const;

  // Declares the streams (index = Context::stream), each by its segments, packed from 0;
  // resets all state. Once, before the first begin().
  void setup(const std::vector<std::vector<Segment>>& streams);

  void begin(const Context& ctx, at::Tensor& x);
  virtual Encoded encode(const Context& ctx, int64_t round, const at::Tensor& x) = 0;
  // kReencode only: `received` holds every worker's piece ctx.rank (rank order); returns the
  // encoding of their average, kept with this worker's second-level error feedback.
  virtual at::Tensor reencode(const Context& ctx, const at::Tensor& received);
  virtual void decode(const Context& ctx, int64_t round, const at::Tensor& combined,
                      at::Tensor& x) = 0;
  // kReencode only, for a reducer that keeps only its own piece (ZeRO's reduce-scatter,
  // parallel/zero/sharded_compression.h): decodes `piece`, what reencode() returned on this
  // worker, into `out` (fp32, the piece's values: ceil(ceil(n / world) / chunk) · chunk for a
  // stream of n). Instead of gathering every piece and decode(); the default refuses.
  virtual void decode_piece(const Context& ctx, int64_t round, const at::Tensor& piece,
                            at::Tensor& out);
  void end(const Context& ctx);

  // For tests: a stream's value as this worker last sent it (decoded), and the error-feedback
  // residual left after that step.
  const at::Tensor& last_sent(int64_t stream) const { return streams_[stream].sent; }
  const at::Tensor& residual(int64_t stream) const { return streams_[stream].residual; }

 protected:
  struct Stream {
    std::vector<Segment> segments;
    int64_t numel = 0;
    at::Tensor residual;  // error feedback
    at::Tensor sent;      // last decoded own contribution; encode() or decode() must set it
    at::Tensor input;     // x after begin(), while error feedback needs it
  };
  // Compressor-specific state per stream, created in setup().
  virtual void setup_stream(const Stream& stream, int64_t index) {}
  Stream& stream(const Context& ctx);

  CompressionOptions options_;
  std::vector<Stream> streams_;
};

// nullptr for CompressorKind::kNone. Validates the options first.
std::unique_ptr<Compressor> make_compressor(const CompressionOptions& options);

}  // namespace krab::compress
