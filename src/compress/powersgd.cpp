// PowerSGD: each matrix approximated as P Qᵀ in two averaged rounds (the essay is in
// compressor.h). Round 0 sends P = M Q; round 1 sends Q = Mᵀ P after P is orthonormalised.
#include <torch/torch.h>

#include "compress/codecs.h"
#include "compress/kinds.h"

namespace krab::compress {
namespace {

class PowerSgd : public Compressor {
 public:
  using Compressor::Compressor;
  Aggregation aggregation() const override { return Aggregation::kSum; }
  int64_t rounds() const override { return 2; }

  bool compressible(const std::vector<int64_t>& shape) const override {
    if (shape.size() < 2) return false;
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    if (numel < options_.min_numel) return false;
    const int64_t rows = shape[0], cols = numel / rows;
    return (rows + cols) * options_.rank < rows * cols;
  }

  Encoded encode(const Context& ctx, int64_t round, const at::Tensor& x) override {
    return {round == 0 ? encode_p(ctx, x) : encode_q(ctx), {}};
  }

  void decode(const Context& ctx, int64_t round, const at::Tensor& averaged,
              at::Tensor& x) override {
    if (round == 0)
      decode_p(ctx, averaged, x);
    else
      decode_q(ctx, averaged, x);
  }

 protected:
  void setup_stream(const Stream& s, int64_t index) override {
    State st;
    for (size_t i = 0; i < s.segments.size(); ++i) {
      auto gen = at::detail::createCPUGenerator(
          mix_seed(options_.seed ^ 0x9057, static_cast<uint64_t>(index), i));
      st.q.push_back(at::randn({s.segments[i].cols, options_.rank}, gen));
    }
    state_.resize(static_cast<size_t>(index) + 1);  // setup() goes 0, 1, ...
    state_[index] = std::move(st);
  }

 private:
  struct State {
    std::vector<at::Tensor> q;  // per segment: cols x rank, kept across steps
    std::vector<at::Tensor> p;  // per segment, this step: the orthonormalised average P
    at::Tensor q_flat;          // this step's Q = Mᵀ P, every segment's, before averaging
  };

  static at::Tensor matrix(const at::Tensor& x, const Segment& s) {
    return x.narrow(0, s.offset, s.numel).view({s.rows, s.cols});
  }

  // P = M Q per matrix, packed.
  at::Tensor encode_p(const Context& ctx, const at::Tensor& x) {
    const int64_t r = options_.rank;
    const std::vector<Segment>& segs = stream(ctx).segments;
    int64_t p_numel = 0;
    for (const Segment& s : segs) p_numel += s.rows * r;
    at::Tensor p_flat = torch::empty({p_numel});
    int64_t at = 0;
    for (size_t i = 0; i < segs.size(); ++i) {
      at::Tensor p = p_flat.narrow(0, at, segs[i].rows * r).view({segs[i].rows, r});
      at::mm_out(p, matrix(x, segs[i]), state_[ctx.stream].q[i]);
      at += segs[i].rows * r;
    }
    return p_flat;
  }

  // Orthonormalises the averaged P and computes Q = Mᵀ P, packed.
  void decode_p(const Context& ctx, const at::Tensor& p_flat, const at::Tensor& x) {
    const int64_t r = options_.rank;
    const std::vector<Segment>& segs = stream(ctx).segments;
    State& st = state_[ctx.stream];
    int64_t q_numel = 0;
    for (const Segment& s : segs) q_numel += s.cols * r;
    st.p.clear();
    st.q_flat = torch::empty({q_numel});
    int64_t pat = 0, qat = 0;
    for (const Segment& s : segs) {
      at::Tensor p = p_flat.narrow(0, pat, s.rows * r).view({s.rows, r});
      st.p.push_back(std::get<0>(at::linalg_qr(p, "reduced")));
      at::Tensor q = st.q_flat.narrow(0, qat, s.cols * r).view({s.cols, r});
      at::mm_out(q, matrix(x, s).t(), st.p.back());
      pat += s.rows * r;
      qat += s.cols * r;
    }
  }

  // Sends Q; this worker's own contribution is P Qᵀ with its Q, before the average.
  at::Tensor encode_q(const Context& ctx) {
    const int64_t r = options_.rank;
    Stream& s = stream(ctx);
    State& st = state_[ctx.stream];
    int64_t qat = 0;
    for (size_t i = 0; i < s.segments.size(); ++i) {
      const Segment& seg = s.segments[i];
      at::Tensor q_own = st.q_flat.narrow(0, qat, seg.cols * r).view({seg.cols, r});
      at::Tensor own = matrix(s.sent, seg);
      at::mm_out(own, st.p[i], q_own.t());
      qat += seg.cols * r;
    }
    return st.q_flat;
  }

  // x = P Qᵀ with the averaged Q, which is kept as the next step's start.
  void decode_q(const Context& ctx, const at::Tensor& q_flat, at::Tensor& x) {
    const int64_t r = options_.rank;
    const std::vector<Segment>& segs = stream(ctx).segments;
    State& st = state_[ctx.stream];
    int64_t qat = 0;
    for (size_t i = 0; i < segs.size(); ++i) {
      at::Tensor q_avg = q_flat.narrow(0, qat, segs[i].cols * r).view({segs[i].cols, r});
      at::Tensor m = matrix(x, segs[i]);
      at::mm_out(m, st.p[i], q_avg.t());
      st.q[i].copy_(q_avg);
      qat += segs[i].cols * r;
    }
    st.p.clear();
    st.q_flat = at::Tensor();
  }

  std::vector<State> state_;  // per stream
};

}  // namespace

std::unique_ptr<Compressor> make_powersgd(const CompressionOptions& options) {
  return std::make_unique<PowerSgd>(options);
}

}  // namespace krab::compress
