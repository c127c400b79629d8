// topk and randomk: a fraction comm.ratio of the values travels (the essay is in compressor.h).
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "compress/codecs.h"
#include "compress/kinds.h"

namespace krab::compress {
namespace {

constexpr int64_t kTopkBlock = 65536;  // indices inside a block fit in uint16

// ceil(ratio · n), at least 1 and at most n.
int64_t sent_count(double ratio, int64_t n) {
  return std::min(n, std::max<int64_t>(1, static_cast<int64_t>(std::ceil(ratio * n))));
}

// topk's fixed payload layout, the same on every worker: per block of the value,
// [fp32 scale][k x uint16 index][k x fp16 value / scale], starting at byte `at`.
struct Block {
  int64_t start, len, k, at;
};
std::vector<Block> topk_blocks(int64_t n, double ratio, int64_t* bytes) {
  std::vector<Block> blocks;
  *bytes = 0;
  for (int64_t s = 0; s < n; s += kTopkBlock) {
    const int64_t len = std::min(kTopkBlock, n - s);
    const int64_t k = sent_count(ratio, len);
    blocks.push_back({s, len, k, *bytes});
    *bytes += 4 + 4 * k;
  }
  return blocks;
}

class TopK : public Compressor {
 public:
  using Compressor::Compressor;
  Aggregation aggregation() const override { return Aggregation::kGather; }

  Encoded encode(const Context& ctx, int64_t, const at::Tensor& x) override {
    int64_t bytes;
    const std::vector<Block> blocks = topk_blocks(x.numel(), options_.ratio, &bytes);
    at::Tensor payload = torch::empty({bytes}, torch::kUInt8);
    at::Tensor& sent = stream(ctx).sent;
    sent.zero_();
    std::vector<at::Tensor> positions;
    for (const Block& b : blocks) {
      at::Tensor xb = x.narrow(0, b.start, b.len);
      at::Tensor idx = std::get<1>(xb.abs().topk(b.k, 0, /*largest=*/true, /*sorted=*/false));
      idx = std::get<0>(idx.sort());
      encode_block(b, xb.index_select(0, idx).contiguous(), idx, payload.data_ptr<uint8_t>() + b.at,
                   sent.data_ptr<float>() + b.start);
      positions.push_back(idx + b.start);
    }
    return {payload, positions.empty() ? torch::empty({0}, torch::kLong) : torch::cat(positions)};
  }

  void decode(const Context& ctx, int64_t, const at::Tensor& gathered, at::Tensor& x) override {
    int64_t bytes;
    const std::vector<Block> blocks = topk_blocks(x.numel(), options_.ratio, &bytes);
    x.zero_();
    float* out = x.data_ptr<float>();
    for (int q = 0; q < ctx.world; ++q)
      for (const Block& b : blocks) {
        const uint8_t* p = gathered.data_ptr<uint8_t>() + q * bytes + b.at;
        float scale;
        std::memcpy(&scale, p, 4);
        for (int64_t i = 0; i < b.k; ++i) {
          uint16_t index;
          c10::Half h;
          std::memcpy(&index, p + 4 + 2 * i, 2);
          std::memcpy(&h, p + 4 + 2 * b.k + 2 * i, 2);
          out[b.start + index] += static_cast<float>(h) * scale;
        }
      }
    x.div_(ctx.world);
  }

 private:
  // Writes block `b`'s payload at `p` from its chosen values and their (sorted, in-block)
  // indices, and what the others will decode of them into `sent` (the block's part).
  static void encode_block(const Block& b, const at::Tensor& vals, const at::Tensor& idx,
                           uint8_t* p, float* sent) {
    const float scale = vals.abs().max().item<float>();
    const float inv = scale > 0 ? 1.0f / scale : 0.0f;
    std::memcpy(p, &scale, 4);
    const int64_t* ip = idx.data_ptr<int64_t>();
    const float* vp = vals.data_ptr<float>();
    for (int64_t i = 0; i < b.k; ++i) {
      const auto index = static_cast<uint16_t>(ip[i]);
      const c10::Half h(vp[i] * inv);
      std::memcpy(p + 4 + 2 * i, &index, 2);
      std::memcpy(p + 4 + 2 * b.k + 2 * i, &h, 2);
      sent[ip[i]] = static_cast<float>(h) * scale;
    }
  }
};

class RandomK : public Compressor {
 public:
  using Compressor::Compressor;
  Aggregation aggregation() const override { return Aggregation::kSum; }

  Encoded encode(const Context& ctx, int64_t, const at::Tensor& x) override {
    at::Tensor idx = draw_positions(x.numel(), ctx);
    at::Tensor vals = x.index_select(0, idx).contiguous();
    stream(ctx).sent.zero_().index_copy_(0, idx, vals);
    positions_[ctx.stream] = idx;
    return {vals, idx};
  }

  void decode(const Context& ctx, int64_t, const at::Tensor& averaged, at::Tensor& x) override {
    x.zero_().index_copy_(0, positions_[ctx.stream], averaged);
  }

 protected:
  void setup_stream(const Stream&, int64_t index) override {
    positions_.resize(static_cast<size_t>(index) + 1);  // setup() goes 0, 1, ...
  }

 private:
  // Floyd's sampling of k distinct positions; same seed on every worker, same positions. A
  // bitmap marks them (a hash set cost more than the backward pass at ratio 0.5), and reading
  // it back gives them in order.
  at::Tensor draw_positions(int64_t n, const Context& ctx) const {
    const int64_t k = sent_count(options_.ratio, n);
    Rng rng(mix_seed(options_.seed ^ 0x7A2D, static_cast<uint64_t>(ctx.step),
                     static_cast<uint64_t>(ctx.stream)));
    std::vector<uint8_t> chosen(static_cast<size_t>(n), 0);
    for (int64_t j = n - k; j < n; ++j) {
      const auto t = static_cast<int64_t>(rng.next() % static_cast<uint64_t>(j + 1));
      chosen[static_cast<size_t>(chosen[t] ? j : t)] = 1;
    }
    at::Tensor idx = torch::empty({k}, torch::kLong);
    int64_t* ip = idx.data_ptr<int64_t>();
    for (int64_t i = 0, m = 0; i < n; ++i)
      if (chosen[static_cast<size_t>(i)]) ip[m++] = i;
    return idx;
  }

  std::vector<at::Tensor> positions_;  // per stream: this step's, in order
};

}  // namespace

std::unique_ptr<Compressor> make_topk(const CompressionOptions& options) {
  return std::make_unique<TopK>(options);
}

std::unique_ptr<Compressor> make_randomk(const CompressionOptions& options) {
  return std::make_unique<RandomK>(options);
}

}  // namespace krab::compress
