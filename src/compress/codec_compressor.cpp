// fp16 / bf16 / int8 / onebit: every worker cuts its value into `world` equal pieces and encodes
// each; worker j averages everyone's piece j and encodes it again; everyone decodes the
// re-encoded pieces (Aggregation::kReencode; the essay is in compressor.h).
#include <torch/torch.h>

#include "compress/codecs.h"
#include "compress/kinds.h"
#include "core/errors.h"

namespace krab::compress {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

float* fptr(const at::Tensor& t) { return t.data_ptr<float>(); }
uint8_t* bptr(const at::Tensor& t) { return t.data_ptr<uint8_t>(); }

class CodecCompressor : public Compressor {
 public:
  explicit CodecCompressor(CompressionOptions options)
      : Compressor(std::move(options)),
        codec_(make_codec(kind_name(options_.kind), options_.chunk,
                          options_.rotation == Rotation::kHadamard)) {}

  Aggregation aggregation() const override { return Aggregation::kReencode; }

  Encoded encode(const Context& ctx, int64_t, const at::Tensor& x) override {
    const int W = ctx.world;
    const int64_t n = x.numel(), piece = piece_numel(n, W), E = codec_->encoded_bytes(piece);
    at::Tensor padded = torch::zeros({W * piece});
    padded.narrow(0, 0, n).copy_(x);
    at::Tensor enc = torch::empty({W * E}, torch::kUInt8);
    Rng rng(mix_seed(options_.seed, static_cast<uint64_t>(ctx.rank),
                     static_cast<uint64_t>(ctx.step), static_cast<uint64_t>(ctx.stream)));
    for (int j = 0; j < W; ++j)
      codec_->encode(fptr(padded) + j * piece, piece, bptr(enc) + j * E, rng);
    // What the others will make of this worker's value: the error feedback's reference.
    at::Tensor own = torch::empty({W * piece});
    for (int j = 0; j < W; ++j) codec_->decode(bptr(enc) + j * E, piece, fptr(own) + j * piece);
    stream(ctx).sent.copy_(own.narrow(0, 0, n));
    return {enc, {}};
  }

  at::Tensor reencode(const Context& ctx, const at::Tensor& received) override {
    const int W = ctx.world;
    const int64_t piece = piece_numel(stream(ctx).numel, W), E = codec_->encoded_bytes(piece);
    at::Tensor& server_res = server_residual_[ctx.stream];
    if (!server_res.defined() || server_res.numel() != piece) server_res = torch::zeros({piece});
    at::Tensor avg = torch::zeros({piece}), tmp = torch::empty({piece});
    for (int q = 0; q < W; ++q) {
      codec_->decode(bptr(received) + q * E, piece, fptr(tmp));
      avg.add_(tmp);
    }
    avg.div_(W);
    const bool ef = options_.error_feedback;
    if (ef) avg.add_(server_res);
    at::Tensor enc = torch::empty({E}, torch::kUInt8);
    Rng rng(mix_seed(options_.seed ^ 0x5EC0, static_cast<uint64_t>(ctx.rank),
                     static_cast<uint64_t>(ctx.step), static_cast<uint64_t>(ctx.stream)));
    codec_->encode(fptr(avg), piece, bptr(enc), rng);
    if (ef) {
      codec_->decode(bptr(enc), piece, fptr(tmp));
      at::sub_out(server_res, avg, tmp);
    }
    return enc;
  }

  void decode(const Context& ctx, int64_t, const at::Tensor& gathered, at::Tensor& x) override {
    const int W = ctx.world;
    const int64_t n = x.numel(), piece = piece_numel(n, W), E = codec_->encoded_bytes(piece);
    at::Tensor padded = torch::empty({W * piece});
    for (int q = 0; q < W; ++q)
      codec_->decode(bptr(gathered) + q * E, piece, fptr(padded) + q * piece);
    x.copy_(padded.narrow(0, 0, n));
  }

  void decode_piece(const Context& ctx, int64_t, const at::Tensor& piece,
                    at::Tensor& out) override {
    const int64_t n = piece_numel(stream(ctx).numel, ctx.world);
    KRAB_CHECK(out.numel() == n && out.is_contiguous(), "decode_piece: output of ", out.numel(),
               " values for a piece of ", n);
    codec_->decode(bptr(piece), n, fptr(out));
  }

 protected:
  void setup_stream(const Stream&, int64_t index) override {
    server_residual_.resize(static_cast<size_t>(index) + 1);  // setup() goes 0, 1, ...
    server_residual_[index] = at::Tensor();                   // sized on first use
  }

 private:
  // Values per piece: a multiple of the codec's chunk, W pieces covering n.
  int64_t piece_numel(int64_t n, int W) const {
    return ceil_div(ceil_div(n, W), codec_->chunk()) * codec_->chunk();
  }

  std::unique_ptr<Codec> codec_;
  std::vector<at::Tensor> server_residual_;  // second-level error feedback, per stream
};

}  // namespace

std::unique_ptr<Compressor> make_codec_compressor(const CompressionOptions& options) {
  return std::make_unique<CodecCompressor>(options);
}

}  // namespace krab::compress
