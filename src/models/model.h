// The model zoo: the networks krab trains, behind one interface and one factory.
//
// Every model is a torch::nn::Module whose parameters are registered under stable names
// ("conv1.weight", "blocks.0.attn.qkv.weight", ...), so checkpoints, gradient buckets and
// tensor-parallel plans can refer to them. Models contain no dropout and no batch norm: both
// would make a worker's result depend on how the global batch was split (batch statistics) or
// on extra random state, breaking the determinism contract (ARCHITECTURE.md).
//
// Initial weights come from torch's global generator (LibTorch's module defaults, and for gpt
// normal(0, 0.02), drawn module by module: each module's construction then its initialisation,
// so gpt's embeddings and first blocks are the same whatever `layers` is); call
// torch::manual_seed(seed) before make_model for reproducible weights.
// The data-parallel engine broadcasts rank 0's weights anyway.
//
// Models:
//   mlp  flatten -> fc1 Linear(in, hidden) -> ReLU -> fc2 Linear(hidden, hidden) -> ReLU
//        -> fc3 Linear(hidden, classes). Any input_shape; in = its product.
//   cnn  conv1 Conv2d(C, 32, 3, pad 1) -> ReLU -> MaxPool 2 -> conv2 Conv2d(32, 64, 3, pad 1)
//        -> ReLU -> MaxPool 2 -> flatten -> fc1 Linear(64 * (H/4) * (W/4), 128) -> ReLU
//        -> fc2 Linear(128, classes). input_shape {C, H, W} with H, W >= 4. This is PyTorch's
//        common small CNN, the one the peer benchmark (PyTorch DDP) trains; on 28x28
//        single-channel input it has 421,642 parameters.
//   gpt  decoder-only transformer over tokens in [0, num_classes): tok_emb Embedding(vocab,
//        width) + pos_emb Embedding(context, width); `layers` pre-LN blocks
//          blocks.i.ln1 -> blocks.i.attn (qkv Linear(width, 3 width), causal softmax attention
//          over `heads` heads, proj Linear(width, width)) -> residual add;
//          blocks.i.ln2 -> blocks.i.mlp (fc Linear(width, 4 width) -> GELU -> proj
//          Linear(4 width, width)) -> residual add;
//        then ln_f LayerNorm and head Linear(width, vocab, no bias). Linear and embedding
//        weights are normal(0, 0.02), the residual projections (attn.proj, mlp.proj) scaled
//        by 1/sqrt(2 layers) as in GPT-2; biases zero. input_shape {T} with T <= context.
//
//   torchscript  the user's own network, saved from Python (models/torchscript.h); its
//        parameters and buffers keep their Python names. It may contain dropout and batch
//        norm: train() / eval() reach it, and spec.freeze_batchnorm keeps batch norm in eval
//        mode for the determinism contract.
//
// Units (models/units.h; what parallel.wrap's `auto` and activation checkpointing act on), in
// forward order: gpt `blocks.0` .. `blocks.{layers-1}` (embeddings, ln_f and head run outside
// units); cnn `conv1` and `conv2` (each with its ReLU and pool), `fc1` (with its ReLU), `fc2`;
// mlp `fc1`, `fc2` (each with its ReLU), `fc3`; a torchscript model the children whose call
// sites krab could rewrite (models/script_units.h: top-level children and ModuleList elements
// called once with one Tensor), the others gathered whole.
//
// Thread safety: as for any torch module — concurrent forwards on one model are fine, training
// one model from several threads is not.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "models/units.h"

namespace krab::models {

struct ModelSpec {
  std::string name;                    // mlp | cnn | gpt | torchscript
  std::vector<int64_t> input_shape;    // per example, from data::DataSplits::input_shape
  int64_t num_classes = 10;            // classes, or the vocabulary size for gpt
  int64_t hidden = 128;                // mlp hidden width
  int64_t layers = 2;                  // gpt blocks
  int64_t width = 128;                 // gpt embedding width
  int64_t heads = 4;                   // gpt attention heads; must divide width
  int64_t context = 64;                // gpt longest sequence (position embedding size)
  std::string path;                    // torchscript: the saved module (model.path)
  std::string loss = "cross_entropy";  // torchscript: train.loss (built-ins: cross_entropy)
  bool freeze_batchnorm = false;       // torchscript: batch norm stays in eval mode in training
  bool trust_code = false;             // torchscript: load without inspecting (model.trust_code)
};

class Model : public torch::nn::Module {
 public:
  // Logits. Classifiers: inputs [B, ...input_shape] float -> [B, classes]. gpt: tokens
  // [B, T] int64 with T <= context -> [B, T, vocab] (InvalidArgument when T > context).
  virtual at::Tensor forward(const at::Tensor& inputs) = 0;

  // Mean cross-entropy over all predictions: logits [..., C] against targets [...] of class
  // indices (for gpt the mean over all B*T positions).
  virtual at::Tensor loss(const at::Tensor& logits, const at::Tensor& targets);

  // {number of argmax predictions equal to the target, number of predictions}, for accuracy.
  virtual std::pair<int64_t, int64_t> correct(const at::Tensor& logits, const at::Tensor& targets);

  // The loss one training batch backpropagates: loss(forward(inputs), targets) unless the
  // model computes its own (a TorchScript module's training_loss).
  virtual at::Tensor training_loss(const at::Tensor& inputs, const at::Tensor& targets) {
    return loss(forward(inputs), targets);
  }

  // What evaluation hands to correct(): forward(inputs) unless the model has its own
  // (a TorchScript module's predict).
  virtual at::Tensor predict(const at::Tensor& inputs) { return forward(inputs); }

  // Units (models/units.h). The module paths this model runs through run_unit(), in forward
  // order ("blocks.0", "blocks.1" for gpt; "conv1", ... for cnn; for a TorchScript module the
  // children it could split). Candidate i is the i-th path. Empty: nothing can be split.
  virtual std::vector<std::string> unit_candidates() const { return {}; }
  // Installs `runner` (null: none) for the candidates: unit_of_candidate[i] is the unit index
  // the runner gets for candidate i, or -1 to run candidate i directly. Not owned; the
  // installer keeps it alive while it is installed. unit_of_candidate must have one entry per
  // candidate (InvalidArgument otherwise).
  void set_unit_runner(UnitRunner* runner, std::vector<int> unit_of_candidate);
  UnitRunner* unit_runner() const { return runner_; }

 protected:
  // forward(x) for candidate `candidate`, through the runner when one is installed for it.
  at::Tensor run_unit(int candidate, const at::Tensor& x, const UnitForward& forward);

 private:
  UnitRunner* runner_ = nullptr;
  std::vector<int> unit_of_candidate_;
};

// Builds the model `spec.name` names; `observer`, when given, is told of each unit as it is
// built (units.h: BuildObserver). InvalidArgument, naming the config key, for: an unknown
// name (the message lists "mlp, cnn, gpt, torchscript"); a torchscript file it cannot use
// (models/torchscript.h); an input_shape the model cannot take (cnn needs
// {C, H, W} with H, W >= 4; gpt needs {T}); a non-positive size; heads not dividing width
// (names model.heads and model.width); a gpt input length above spec.context.
std::shared_ptr<Model> make_model(const ModelSpec& spec, BuildObserver* observer = nullptr);

// Total number of elements over module.parameters() (trainable and frozen).
int64_t parameter_count(const torch::nn::Module& module);

}  // namespace krab::models
