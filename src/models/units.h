// Units: the pieces of a model that an engine may act around (docs/design/zero-sharding.md §3).
//
// A model runs some of its submodules through Model::run_unit(candidate, x, forward) instead of
// calling them directly: GPT each block, the CNN and MLP each layer, a TorchScript module the
// children whose call sites krab could rewrite. Without a runner that is just forward(x). With
// one installed (a ZeRO stage-3 engine gathering the unit's parameters, activation
// checkpointing recomputing it in backward), the runner owns the call: it does what it must
// before and after, and may attach autograd nodes to the output so that it also acts in
// backward. LibTorch's C++ nn::Module has no forward hooks, and a hook could not recompute.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <string>

namespace torch::nn {
class Module;
}

namespace krab::models {

using UnitForward = std::function<at::Tensor(const at::Tensor&)>;

class UnitRunner {
 public:
  virtual ~UnitRunner() = default;
  // Runs unit `unit` (an index the installer chose: Model::set_unit_runner's mapping) on
  // input x. Must return what forward(x) returns, up to where the gradient goes. Called on the
  // training thread, in forward order, once per unit call.
  virtual at::Tensor run(int unit, const at::Tensor& x, const UnitForward& forward) = 0;
};

// Told about each unit as soon as it exists, while make_model builds the model (design §3.4):
// a sharded engine can keep its shard of a unit and free the rest before the next unit is
// built, so a model larger than one worker never exists whole.
//
// make_model calls on_unit_built once per unit candidate, in forward order, with the
// candidate's path and submodule, after that submodule is constructed AND initialised:
// nothing make_model does afterwards changes its parameters. Then once more with path "" and
// the whole model, when every parameter is initialised (the parameters outside candidates —
// gpt's embeddings, ln_f and head — are final from then on). gpt builds and initialises one
// module after the other (so a unit's weights are final before the next unit exists); cnn and
// mlp are built whole first and announced afterwards; a torchscript model is loaded whole and
// announces only the root. Called on the thread that calls make_model; may throw, which
// make_model lets through.
class BuildObserver {
 public:
  virtual ~BuildObserver() = default;
  virtual void on_unit_built(const std::string& path, torch::nn::Module& module) = 0;
};

}  // namespace krab::models
