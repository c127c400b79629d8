// Train/eval flags frozen into a TorchScript module's code.
//
// torch.jit.trace records the operators a forward ran with the values they got: the `training`
// argument of batch_norm, dropout, instance_norm, rrelu, lstm ... becomes a constant, true for a
// module traced in train mode, false for one traced in eval mode. Module.train() / eval() then
// change the module's `training` attribute, which nothing in the traced code reads: a module
// traced in train mode keeps dropping activations and updating BatchNorm's running statistics in
// eval mode, and one traced in eval mode never does either, in training too.
// torch.jit.script instead compiles `self.training` into the code (nn.BatchNorm, nn.Dropout,
// nn.LSTM and F.dropout(x, p, self.training) pass it on from the attribute), and is not affected.
//
// frozen_mode_calls finds the operator calls whose flag is such a constant. A flag that cannot
// change what the call computes is left out: a norm without running statistics (a constant None
// running_mean: BatchNorm or InstanceNorm with track_running_stats=False normalises with the
// batch's statistics in both modes, in Python too), and a dropout probability that is the
// constant 0 (an LSTM without dropout between its layers). models::TorchScriptModel refuses a
// module with a frozen true flag and warns once of the frozen false ones (docs/models.md).
//
// Thread safety: none needed; reads the module.
#pragma once

#include <torch/script.h>

#include <string>
#include <vector>

namespace krab::models {

struct FrozenModeCall {
  // Where the call is: the submodule's path and the method ("bn.forward", "forward" for the top
  // module), or a free function's qualified name.
  std::string where;
  std::string op;        // "aten::batch_norm"
  std::string argument;  // the flag's name in the operator's schema: "training", "train", ...
  bool value = false;    // the constant
};

// Every call in the graphs of `module` (models::walk_script_graphs: every method and function,
// once) whose bool argument named `training`, `train` or `use_input_stats` is a constant and
// matters (above), in the walk's order.
std::vector<FrozenModeCall> frozen_mode_calls(const torch::jit::Module& module);

}  // namespace krab::models
