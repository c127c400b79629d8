// The unit split of a TorchScript module (docs/design/zero-sharding.md §3.3).
//
// A built-in model runs each of its units through Model::run_unit at its own call sites. A
// user's scripted module cannot be asked to: its code was written in Python and does not know
// krab. So krab rewrites a *copy* of the root module's method graphs instead. Each call of a
// child module that can stand alone as a unit,
//
//   %layer1 = prim::GetAttr[name="layer1"](%self)
//   %h      = prim::CallMethod[name="forward"](%layer1, %x)
//
// becomes a call of the operator krab registers (models/torchscript.cpp),
//
//   %h      = krab::unit_call(%x, 0)          # 0: the unit's index among the candidates
//
// whose kernel asks the running TorchScriptModel to run unit 0 through Model::run_unit, i.e.
// through whatever UnitRunner an engine installed (a stage-3 gather, activation checkpointing).
// The copies are added to the module's type as `__krab_forward`, `__krab_training_loss` and
// `__krab_predict`; in the copies of training_loss and predict, `self.forward(...)` calls
// `__krab_forward`. The original methods are not touched, and the model file krab writes
// (model.ts) never holds a copy (TorchScriptModel::save leaves every `__krab_` method out).
//
// What is a unit. A child module (any module path) is a unit when, in every one of forward,
// training_loss and predict that the module defines:
//   - it is reached only by a chain of prim::GetAttr from `self` that ends in a call of its
//     forward: one Tensor in, one Tensor out;
//   - that call runs at most once per run of the method (a self.forward call in training_loss
//     counts forward's calls), and not inside a loop or a branch;
//   - nothing else reaches it, its parameters, one of its own submodules or a module above it
//     (other than by the GetAttr chain to a unit): `self.fc.weight` read in the root's code,
//     `self.encoder` passed to a call, a call in a method of self other than these three;
//   - it holds at least one trainable parameter (requires_grad; ZeRO shards only those, so a
//     unit without one would have nothing to gather).
// So top-level children called once (ResNet's layer1..layer4, the parts of a root that is an
// nn.Sequential) and the elements of a ModuleList iterated in the root's forward (TorchScript
// unrolls `for b in self.blocks` into one call per element, `getattr(self.blocks, "0")`) are
// units. Every other child that holds trainable parameters and that one of the three methods
// reaches is "gathered whole" with a reason, and the plan is never refused: its parameters stay
// with the root unit.
//
// Thread safety: none needed; the planner reads the module, apply_script_units writes its type
// (call it once, before the module runs on any other thread).
#pragma once

#include <torch/script.h>

#include <string>
#include <vector>

namespace krab::models {

struct ScriptUnitPlan {
  // The units: module paths ("layer1", "blocks.0"), in the order of their first call in
  // forward (then training_loss, then predict). Unit i is the operator's unit argument i and
  // Model::unit_candidates()[i].
  std::vector<std::string> units;
  // The children reached and holding trainable parameters that are not units, one line each,
  // "<path>: <reason>" ("head: returns a tuple", "b: called inside a loop"), in path order. When
  // the whole split failed (apply_script_units threw), one line without a path.
  std::vector<std::string> gathered_whole;
};

// The units of `module` (above). Never throws for a module's shape; a module without forward
// gets no units.
ScriptUnitPlan plan_script_units(const torch::jit::Module& module);

// The name of a method's rewritten copy: "__krab_" + method.
std::string script_unit_method(const std::string& method);

// Adds `__krab_<method>` for each of forward, training_loss and predict that `module` defines,
// calling krab::unit_call for every unit of `plan` (plan.units must be non-empty). Throws
// NotSupported when the module already has a method of such a name, or whatever LibTorch throws
// when a copy cannot be made; the module's type is then as before (the copies made so far are
// removed).
void apply_script_units(torch::jit::Module& module, const ScriptUnitPlan& plan);

}  // namespace krab::models
