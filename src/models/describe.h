// What a built-in model will hold, known from its ModelSpec alone: no module is constructed, no
// tensor allocated. The launcher sizes a job with it before any worker starts
// (docs/design/zero-sharding.md §5.2), so a configuration whose model would take more memory
// than the node has is refused in milliseconds instead of being built first.
//
// describe_parameters is the constructors' shapes written out a second time; a test builds each
// model and asserts that the two agree name for name, shape for shape, in order. A change to a
// built-in model's layers must change both.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "models/model.h"

namespace krab::models {

// One parameter as make_model(spec) would register it.
struct ParameterShape {
  std::string name;            // as named_parameters() names it: "blocks.0.attn.qkv.weight"
  std::vector<int64_t> shape;  // as its sizes()
  bool trainable = true;       // requires_grad; every built-in parameter is trainable
};

struct ParameterTable {
  // In named_parameters() order.
  std::vector<ParameterShape> params;
  // The module paths the model runs as units (Model::unit_candidates), in forward order:
  // gpt "blocks.0" .. "blocks.{layers-1}"; cnn "conv1 conv2 fc1 fc2"; mlp "fc1 fc2 fc3".
  std::vector<std::string> unit_candidates;
  int64_t numel() const;  // Σ elements over params
};

// The table for spec.name mlp, cnn or gpt. Refuses (InvalidArgument, naming the key) exactly
// what make_model(spec) refuses for these models; "torchscript" is refused too, because only its
// file knows its parameters (the caller reads the archive instead). Pure.
ParameterTable describe_parameters(const ModelSpec& spec);

// The smallest model of `spec`'s kind that takes the same inputs and gives the same outputs:
// what the launcher runs its dry run on (train/preflight.h) when the model itself is too large
// to build there. mlp: hidden 8; gpt: one block of width = heads (one value per head; vocab,
// context and heads kept). Inputs that fail the model (a dtype, tokens past the vocabulary or
// the context, labels the loss cannot take) fail the reduced one the same way, because the
// layers that read the inputs and the loss see the same shapes. nullopt where no knob shrinks
// the model without changing what it takes (cnn: its size follows the images; torchscript).
// `spec` must be one describe_parameters accepts, or torchscript. Pure.
std::optional<ModelSpec> reduced_spec(const ModelSpec& spec);

// Bytes of activations one forward and backward of `batch` examples of `spec`'s input shape
// needs at its peak (fp32), a deliberately plain estimate for the memory check: the tensors
// autograd saves in forward, plus the largest layer's set again for the gradients that are
// alive while backward passes through it.
//   gpt  per block and token 16·width values (layer-norm inputs and outputs, qkv, the attention
//        output, the MLP's 4·width hidden before and after GELU, the residual) plus 2·heads·T
//        attention scores (before and after softmax); the embeddings' sum, the final layer
//        norm, and the logits with their softmax (2·vocab per token). With checkpointing each
//        block keeps only its input (width per token) and one block's set is recomputed at a
//        time.
//   cnn  every layer's output before and after ReLU and pooling, the pooling indices (int64);
//        checkpointing is not modelled for it (the full set, an upper bound).
//   mlp  each layer's output before and after ReLU, and the logits.
// 0 for torchscript (not predicted: its file alone knows its layers). Pure; `spec` must be one
// describe_parameters accepts.
int64_t activation_bytes(const ModelSpec& spec, int64_t batch, bool checkpointing);

// Peak bytes of the tensors one forward pass without gradients holds for `samples` examples:
// what evaluation needs (it runs the test split in batches of up to 512, far larger than a
// training batch, so for a small model on a large test split this, not training, sets a
// worker's peak). Nothing is saved for backward, so the peak is the largest single phase:
//   gpt  per token the largest of a block's MLP (the residual, its layer norm, the 4·width
//        hidden before and after GELU, the output and the new residual: 12·width, every
//        temporary of the statement alive until it ends), its attention (the residual, its
//        norm, qkv and the output, 6·width, with 3·heads·T scores: the product, the masked
//        copy and the softmax) and the head (the residual, the final norm, 2·vocab logits and
//        their log-softmax).
//   cnn, mlp  the training estimate without checkpointing (an upper bound: nothing is saved).
// 0 for torchscript. Pure; `spec` must be one describe_parameters accepts.
int64_t evaluation_activation_bytes(const ModelSpec& spec, int64_t samples);

}  // namespace krab::models
