// describe_parameters: each builder's registrations written out as (name, shape) rows. The
// order is named_parameters()'s: modules in registration order, depth first, a module's own
// parameters (weight before bias, as LibTorch's Linear, Conv2d, Embedding and LayerNorm register
// them) before its children's.
#include "models/describe.h"

#include <algorithm>

#include "core/errors.h"
#include "models/builders.h"

namespace krab::models {
namespace {

constexpr int64_t kFloatBytes = 4;

void add(ParameterTable& t, const std::string& name, std::vector<int64_t> shape) {
  t.params.push_back({name, std::move(shape), true});
}

// torch::nn::Linear(in, out): weight [out, in], then bias [out] unless disabled.
void add_linear(ParameterTable& t, const std::string& path, int64_t in, int64_t out,
                bool bias = true) {
  add(t, path + ".weight", {out, in});
  if (bias) add(t, path + ".bias", {out});
}

void add_layer_norm(ParameterTable& t, const std::string& path, int64_t width) {
  add(t, path + ".weight", {width});
  add(t, path + ".bias", {width});
}

int64_t product(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

ParameterTable describe_mlp(const ModelSpec& spec) {
  ParameterTable t;
  add_linear(t, "fc1", product(spec.input_shape), spec.hidden);
  add_linear(t, "fc2", spec.hidden, spec.hidden);
  add_linear(t, "fc3", spec.hidden, spec.num_classes);
  t.unit_candidates = {"fc1", "fc2", "fc3"};
  return t;
}

ParameterTable describe_cnn(const ModelSpec& spec) {
  const auto& s = spec.input_shape;
  ParameterTable t;
  add(t, "conv1.weight", {32, s[0], 3, 3});
  add(t, "conv1.bias", {32});
  add(t, "conv2.weight", {64, 32, 3, 3});
  add(t, "conv2.bias", {64});
  add_linear(t, "fc1", 64 * (s[1] / 4) * (s[2] / 4), 128);
  add_linear(t, "fc2", 128, spec.num_classes);
  t.unit_candidates = {"conv1", "conv2", "fc1", "fc2"};
  return t;
}

ParameterTable describe_gpt(const ModelSpec& spec) {
  const int64_t w = spec.width;
  ParameterTable t;
  add(t, "tok_emb.weight", {spec.num_classes, w});
  add(t, "pos_emb.weight", {spec.context, w});
  for (int64_t i = 0; i < spec.layers; ++i) {
    const std::string block = str_cat("blocks.", i);
    add_layer_norm(t, block + ".ln1", w);
    add_linear(t, block + ".attn.qkv", w, 3 * w);
    add_linear(t, block + ".attn.proj", w, w);
    add_layer_norm(t, block + ".ln2", w);
    add_linear(t, block + ".mlp.fc", w, 4 * w);
    add_linear(t, block + ".mlp.proj", 4 * w, w);
    t.unit_candidates.push_back(block);
  }
  add_layer_norm(t, "ln_f", w);
  add_linear(t, "head", w, spec.num_classes, /*bias=*/false);
  return t;
}

// Values (not bytes) of the GPT estimate in the header, for `tokens` tokens.
int64_t gpt_activation_values(const ModelSpec& spec, int64_t tokens, bool checkpointing) {
  const int64_t t = spec.input_shape[0];
  const int64_t per_block = tokens * (16 * spec.width + 2 * spec.heads * t);
  const int64_t outside = tokens * (3 * spec.width + 2 * spec.num_classes);
  const int64_t blocks =
      checkpointing ? spec.layers * tokens * spec.width + per_block : spec.layers * per_block;
  return blocks + outside + per_block;  // + one block's gradients during its backward
}

int64_t cnn_activation_values(const ModelSpec& spec, int64_t batch) {
  const int64_t h = spec.input_shape[1], w = spec.input_shape[2];
  const int64_t c1 = 32 * h * w, p1 = 32 * (h / 2) * (w / 2);
  const int64_t c2 = 64 * (h / 2) * (w / 2), p2 = 64 * (h / 4) * (w / 4);
  // conv output, ReLU output, pooled output and int64 indices (two floats' worth) per layer.
  const int64_t saved = 2 * c1 + 3 * p1 + 2 * c2 + 3 * p2 + 2 * 128 + 2 * spec.num_classes;
  return batch * (saved + std::max(c1, c2));
}

}  // namespace

int64_t ParameterTable::numel() const {
  int64_t n = 0;
  for (const ParameterShape& p : params) n += product(p.shape);
  return n;
}

ParameterTable describe_parameters(const ModelSpec& spec) {
  KRAB_CHECK_ARG(spec.name != "torchscript",
                 "describe_parameters: a torchscript model's parameters are in its file (",
                 spec.path, "), not in the spec");
  detail::check_builtin_spec(spec);
  if (spec.name == "mlp") {
    detail::check_mlp_spec(spec);
    return describe_mlp(spec);
  }
  if (spec.name == "cnn") {
    detail::check_cnn_spec(spec);
    return describe_cnn(spec);
  }
  if (spec.name == "gpt") {
    detail::check_gpt_spec(spec);
    return describe_gpt(spec);
  }
  throw InvalidArgument(
      str_cat("unknown model '", spec.name, "'; known models: mlp, cnn, gpt, torchscript"));
}

std::optional<ModelSpec> reduced_spec(const ModelSpec& spec) {
  ModelSpec small = spec;
  if (spec.name == "mlp") {
    small.hidden = std::min<int64_t>(spec.hidden, 8);
    return small;
  }
  if (spec.name == "gpt") {
    // Heads kept, so that the attention splits the width as the real model's does.
    small.layers = std::min<int64_t>(spec.layers, 1);
    small.width = std::min(spec.width, spec.heads);
    return small;
  }
  return std::nullopt;
}

int64_t activation_bytes(const ModelSpec& spec, int64_t batch, bool checkpointing) {
  if (spec.name == "gpt")
    return kFloatBytes * gpt_activation_values(spec, batch * spec.input_shape[0], checkpointing);
  if (spec.name == "cnn") return kFloatBytes * cnn_activation_values(spec, batch);
  if (spec.name == "mlp") {
    const int64_t per_example = 4 * spec.hidden + 2 * spec.num_classes + spec.hidden;
    return kFloatBytes * batch * per_example;
  }
  return 0;
}

int64_t evaluation_activation_bytes(const ModelSpec& spec, int64_t samples) {
  if (spec.name == "gpt") {
    const int64_t t = spec.input_shape[0];
    const int64_t w = spec.width;
    const int64_t per_token =
        std::max({12 * w, 6 * w + 3 * spec.heads * t, 2 * w + 2 * spec.num_classes});
    return kFloatBytes * samples * t * per_token;
  }
  return activation_bytes(spec, samples, false);
}

}  // namespace krab::models
