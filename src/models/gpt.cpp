// A small decoder-only transformer (GPT-2 layout, pre-LN), written out rather than built on
// torch::nn::MultiheadAttention so that parameter names are stable and simple
// ("blocks.0.attn.qkv.weight") and tensor-parallel plans can split qkv / proj by name.
#include <torch/torch.h>

#include <cmath>
#include <limits>

#include "core/errors.h"
#include "models/builders.h"

namespace krab::models::detail {
namespace {

class CausalSelfAttention : public torch::nn::Module {
 public:
  CausalSelfAttention(int64_t width, int64_t heads)
      : heads_(heads),
        qkv_(register_module("qkv", torch::nn::Linear(width, 3 * width))),
        proj_(register_module("proj", torch::nn::Linear(width, width))) {}

  at::Tensor forward(const at::Tensor& x) {
    const int64_t b = x.size(0), t = x.size(1), c = x.size(2), d = c / heads_;
    const std::vector<at::Tensor> qkv = qkv_->forward(x).chunk(3, -1);
    // [B, T, C] -> [B, heads, T, d]
    auto split_heads = [&](const at::Tensor& y) {
      return y.view({b, t, heads_, d}).transpose(1, 2);
    };
    const at::Tensor q = split_heads(qkv[0]), k = split_heads(qkv[1]), v = split_heads(qkv[2]);

    at::Tensor att = torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(double(d)));
    // Position i may attend to j <= i only. The mask is rebuilt per call (T*T booleans) rather
    // than kept as a registered buffer, which would be checkpointed and broadcast for nothing.
    const at::Tensor future =
        torch::ones({t, t}, torch::TensorOptions().dtype(torch::kBool).device(x.device())).triu(1);
    att = torch::softmax(att.masked_fill(future, -std::numeric_limits<float>::infinity()), -1);
    const at::Tensor y = torch::matmul(att, v).transpose(1, 2).contiguous().view({b, t, c});
    return proj_->forward(y);
  }

 private:
  int64_t heads_;
  torch::nn::Linear qkv_, proj_;
};

class FeedForward : public torch::nn::Module {
 public:
  explicit FeedForward(int64_t width)
      : fc_(register_module("fc", torch::nn::Linear(width, 4 * width))),
        proj_(register_module("proj", torch::nn::Linear(4 * width, width))) {}

  at::Tensor forward(const at::Tensor& x) { return proj_->forward(torch::gelu(fc_->forward(x))); }

 private:
  torch::nn::Linear fc_, proj_;
};

class Block : public torch::nn::Module {
 public:
  Block(int64_t width, int64_t heads)
      : ln1_(register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})))),
        attn_(register_module("attn", std::make_shared<CausalSelfAttention>(width, heads))),
        ln2_(register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})))),
        mlp_(register_module("mlp", std::make_shared<FeedForward>(width))) {}

  at::Tensor forward(at::Tensor x) {
    x = x + attn_->forward(ln1_->forward(x));
    return x + mlp_->forward(ln2_->forward(x));
  }

 private:
  torch::nn::LayerNorm ln1_;
  std::shared_ptr<CausalSelfAttention> attn_;
  torch::nn::LayerNorm ln2_;
  std::shared_ptr<FeedForward> mlp_;
};

class Gpt : public Model {
 public:
  // Module by module, in registration order: construct, initialise, and (blocks) announce to
  // `observer`, so each block's weights are final before the next block exists (units.h).
  Gpt(const ModelSpec& spec, BuildObserver* observer)
      : context_(spec.context), residual_std_(0.02 / std::sqrt(2.0 * double(spec.layers))) {
    tok_emb_ = register_module("tok_emb", torch::nn::Embedding(spec.num_classes, spec.width));
    init("tok_emb", *tok_emb_);
    pos_emb_ = register_module("pos_emb", torch::nn::Embedding(spec.context, spec.width));
    init("pos_emb", *pos_emb_);
    blocks_ = register_module("blocks", torch::nn::ModuleList());
    for (int64_t i = 0; i < spec.layers; ++i) {
      const std::string path = "blocks." + std::to_string(i);
      block_ptrs_.push_back(std::make_shared<Block>(spec.width, spec.heads));
      blocks_->push_back(block_ptrs_.back());
      init(path, *block_ptrs_.back());
      if (observer != nullptr) observer->on_unit_built(path, *block_ptrs_.back());
    }
    ln_f_ =
        register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({spec.width})));
    head_ = register_module(
        "head",
        torch::nn::Linear(torch::nn::LinearOptions(spec.width, spec.num_classes).bias(false)));
    init("head", *head_);
  }

  at::Tensor forward(const at::Tensor& tokens) override {
    KRAB_CHECK_ARG(tokens.dim() == 2, "gpt expects tokens of shape [batch, time], got ",
                   tokens.sizes());
    const int64_t t = tokens.size(1);
    KRAB_CHECK_ARG(t <= context_, "gpt input has ", t, " tokens, more than model.context ",
                   context_);
    const at::Tensor positions =
        torch::arange(t, torch::TensorOptions().dtype(torch::kInt64).device(tokens.device()));
    at::Tensor x = tok_emb_->forward(tokens) + pos_emb_->forward(positions);
    for (size_t i = 0; i < block_ptrs_.size(); ++i)
      x = run_unit(static_cast<int>(i), x,
                   [block = block_ptrs_[i]](const at::Tensor& h) { return block->forward(h); });
    return head_->forward(ln_f_->forward(x));
  }

  // Each block is a unit; the embeddings, ln_f and head run outside units (the root).
  std::vector<std::string> unit_candidates() const override {
    std::vector<std::string> paths;
    for (size_t i = 0; i < block_ptrs_.size(); ++i) paths.push_back("blocks." + std::to_string(i));
    return paths;
  }

 private:
  // GPT-2's initialisation of the module at `path`. The residual projections get a smaller std
  // because `layers` of them add into the same stream; without it the residual variance grows
  // with depth.
  void init(const std::string& path, torch::nn::Module& module) {
    torch::NoGradGuard no_grad;
    for (auto& item : module.named_parameters()) {
      const std::string name = path + "." + item.key();
      at::Tensor& p = item.value();
      const bool is_norm = name.rfind("ln", 0) == 0 || name.find(".ln") != std::string::npos;
      if (is_norm) continue;  // LayerNorm keeps weight 1, bias 0
      if (name.size() >= 5 && name.compare(name.size() - 5, 5, ".bias") == 0) {
        p.zero_();
      } else if (name.find("attn.proj.weight") != std::string::npos ||
                 name.find("mlp.proj.weight") != std::string::npos) {
        p.normal_(0.0, residual_std_);
      } else {
        p.normal_(0.0, 0.02);
      }
    }
  }

  int64_t context_;
  double residual_std_;
  torch::nn::Embedding tok_emb_{nullptr}, pos_emb_{nullptr};
  torch::nn::ModuleList blocks_{nullptr};
  std::vector<std::shared_ptr<Block>> block_ptrs_;  // typed views of blocks_' entries
  torch::nn::LayerNorm ln_f_{nullptr};
  torch::nn::Linear head_{nullptr};
};

}  // namespace

void check_gpt_spec(const ModelSpec& spec) {
  KRAB_CHECK_ARG(spec.layers >= 1, "model.layers must be >= 1, got ", spec.layers);
  KRAB_CHECK_ARG(spec.width >= 1, "model.width must be >= 1, got ", spec.width);
  KRAB_CHECK_ARG(spec.heads >= 1, "model.heads must be >= 1, got ", spec.heads);
  KRAB_CHECK_ARG(spec.context >= 1, "model.context must be >= 1, got ", spec.context);
  KRAB_CHECK_ARG(spec.width % spec.heads == 0, "model.heads (", spec.heads,
                 ") must divide model.width (", spec.width, ")");
  KRAB_CHECK_ARG(spec.input_shape.size() == 1,
                 "model 'gpt' needs token sequences (input shape {T}); the data has shape ",
                 at::IntArrayRef(spec.input_shape), " (use 'mlp' or 'cnn' for this data)");
  KRAB_CHECK_ARG(spec.input_shape[0] <= spec.context, "the data's sequences have ",
                 spec.input_shape[0], " tokens, more than model.context ", spec.context);
}

std::shared_ptr<Model> make_gpt(const ModelSpec& spec, BuildObserver* observer) {
  check_gpt_spec(spec);
  return std::make_shared<Gpt>(spec, observer);
}

}  // namespace krab::models::detail
