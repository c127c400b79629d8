// Activation checkpointing: run a unit without keeping its activations, and run it again in
// backward to differentiate it (docs/design/zero-sharding.md §3.5; docs/models.md).
//
// A model's forward keeps, for backward, the tensors its operations saved: for a GPT block the
// attention scores, the softmax, the MLP's 4·width hidden layer and more, per layer. Under
// run_recomputed a unit keeps only its input. In backward the unit is run again with gradients
// on, from that input, and the fresh little graph is differentiated at once. Peak memory drops
// from all units' activations to one unit's activations plus every unit's input, for a second
// forward's worth of compute.
//
// Gradients are bit-identical to the plain run: the same operations run on the same bytes, in
// the same autocast state (train.precision), and, when the unit drew random numbers from the
// CPU generator in its first run, from the same generator state. The built-in models draw none
// (ARCHITECTURE.md: no dropout).
//
// Contract of `forward` (what the unit's closure may do):
//   - read only `x`, the tensors in `params`, and values that do not need gradients. A tensor
//     outside those that requires grad (another unit's parameter, a tensor computed before the
//     unit) would get no gradient from the unit: the recompute differentiates with respect to
//     x and params only.
//   - be deterministic given its inputs (and the generator state), and not modify x in place.
//   - return one floating-point tensor.
// run_recomputed keeps a reference to `forward` (and what it captures) until backward has run
// the unit again or the graph is freed: captures must outlive the graph, as a model's modules
// do.
//
// Buffers: a unit's forward may update its buffers (batch norm's running statistics in
// training mode). Pass them as `buffers`: the recompute then starts from the values the first
// run found and leaves the values the first run left, so the update is applied once and the
// recomputed activations equal the first run's. (Costs one copy of the buffers per unit call.)
//
// When gradients are off (GradMode disabled, e.g. evaluation) or nothing in x and params
// requires grad, run_recomputed is just forward(x).
//
// Thread safety: each call builds its own autograd node; training threads (thread-ranks) may
// call it at once. The CPU generator is shared by the threads of a process: a unit that draws
// random numbers is restored to its own state for the recompute, which another thread drawing
// at the same moment would disturb (such a run is not deterministic anyway).
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "models/model.h"
#include "models/units.h"

namespace krab::models {

// forward(x), whose activations are recomputed in backward instead of kept. The result carries
// one autograd node whose next edges are x's and the parameters'. Identical values and, after
// backward, identical gradients (x and params) to forward(x) itself.
at::Tensor run_recomputed(const at::Tensor& x, const std::vector<at::Tensor>& params,
                          const UnitForward& forward, const std::vector<at::Tensor>& buffers = {});

// The UnitRunner of model.activation_checkpointing without sharding: every unit it runs goes
// through run_recomputed with that unit's parameters and buffers. Built over a model's unit
// candidates; install it with install() (unit i = candidate i). The runner must outlive its
// installation; its destructor does not uninstall it.
class RecomputeRunner : public UnitRunner {
 public:
  // Collects the parameters (trainable and frozen) and buffers of each of model.unit_candidates(),
  // by module path. Throws InvalidArgument if a candidate names no submodule.
  explicit RecomputeRunner(const Model& model);

  // Installs this runner on `model` (the one it was built over) for every candidate.
  void install(Model& model);

  // How many units this runner recomputes (= the model's candidates).
  size_t units() const { return params_.size(); }

  at::Tensor run(int unit, const at::Tensor& x, const UnitForward& forward) override;

 private:
  std::vector<std::vector<at::Tensor>> params_;   // by unit = candidate index
  std::vector<std::vector<at::Tensor>> buffers_;  // likewise
};

}  // namespace krab::models
