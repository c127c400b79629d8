// ShardOptimizers: the optimizer of ZeRO stages 1-2 — one LibTorch optimizer per unit, over
// that unit's shard of this rank (docs/design/zero-sharding.md §1.4).
//
// Each is made by the job's own optimizer factory (train/job.cpp make_optimizer, the one the
// data-parallel engine uses) over one tensor, UnitStorage::shard(u). SGD (with momentum,
// nesterov, weight decay) and Adam / AdamW are element-wise given their options and step
// count, so stepping each shard reproduces the stage-0 update of those elements exactly, and
// the padding (gradient 0, state 0) stays exactly 0. Anything else — an optimizer that uses a
// norm over a whole tensor — would need a reduction across shards and is refused.
//
// One optimizer per unit (not one over all shards) because checkpoints (and later offload) go
// unit by unit; ShardedState::optimizers hands them out.
//
// Thread safety: the training thread only.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

#include "parallel/dp_engine.h"

namespace krab::parallel::zero {

// One tensor's state in an SGD, Adam or AdamW as plain tensors: `fields` in the order
// offload.h's optimizer_fields() counts them (Adam / AdamW: exp_avg, exp_avg_sq, then
// max_exp_avg_sq with amsgrad; SGD with momentum: the momentum buffer) and Adam's step count.
// `present` is false where the optimizer keeps none for the tensor (before its first step;
// plain SGD never).
struct TensorState {
  bool present = false;
  int64_t step = 0;
  std::vector<at::Tensor> fields;
};

// `optimizer`'s state for `param` (the fields are its own tensors, not copies).
TensorState get_tensor_state(torch::optim::Optimizer& optimizer, const at::Tensor& param);
// Makes `state` `optimizer`'s state for `param` (the tensors are adopted, not copied), as its
// step() would have left it: the next step takes the "state exists" branch. Not present, or
// SGD without fields: the state is removed.
void set_tensor_state(torch::optim::Optimizer& optimizer, const at::Tensor& param,
                      TensorState state);

class ShardOptimizers {
 public:
  // One optimizer per tensor of `shards` (this rank's shard of each unit; empty tensors too),
  // from `make_optimizer`. Throws InvalidArgument naming train.optimizer.name when the factory
  // makes anything but torch::optim::SGD, Adam or AdamW.
  ShardOptimizers(const std::vector<at::Tensor>& shards, const OptimizerFactory& make_optimizer);
  ~ShardOptimizers();

  int size() const { return static_cast<int>(optimizers_.size()); }
  torch::optim::Optimizer& at(int unit) { return *optimizers_.at(unit); }
  std::vector<torch::optim::Optimizer*> pointers() const;

  // Sets every group's learning rate to `lr`, then steps every unit whose shard has a gradient
  // (a unit of 0 elements has none).
  void step(double lr);
  // The same for unit `unit` alone (DiskOffload steps the units through its window).
  void step_unit(int unit, double lr);
  // Bytes of the optimizers' state tensors (momentum, Adam's moments), those over an offload
  // file included.
  int64_t state_bytes() const;

 private:
  std::vector<std::unique_ptr<torch::optim::Optimizer>> optimizers_;
};

}  // namespace krab::parallel::zero
