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

}  // namespace krab::models
