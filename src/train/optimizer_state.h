// An optimizer's state as record entries (core/record.h), without LibTorch archives.
//
// LibTorch's Optimizer::save/load go through torch::serialize archives, which are TorchScript
// archives: loading one runs whatever code a forged file carries. Checkpoints therefore write
// the state of the optimizers krab builds (train/job.cpp: SGD, Adam, AdamW) as plain entries:
//
//   optimizer.type                  string  "sgd" | "adam" | "adamw"
//   optimizer.groups                int     number of parameter groups
//   optimizer.group.G.params        int     parameters in group G
//   optimizer.group.G.<option>      double  SGD: lr momentum dampening weight_decay nesterov;
//                                           Adam/AdamW: lr beta1 beta2 eps weight_decay amsgrad
//                                           (booleans as 0 / 1)
//   optimizer.state.K.<field>               for parameter K, counted across groups in order:
//       SGD:        momentum_buffer (tensor, absent until the first step with momentum)
//       Adam/AdamW: step (int), exp_avg, exp_avg_sq, max_exp_avg_sq (tensors; the last only
//                   with amsgrad); all absent for a parameter that has not been stepped.
//
// As in PyTorch's load_state_dict, the saved group options replace the optimizer's (the trainer
// sets lr before every step anyway).
#pragma once

#include <torch/optim/optimizer.h>

#include <functional>

#include "core/record.h"

namespace krab::train {

// Appends `optimizer`'s state to `out`. NotSupported naming the type for an optimizer other
// than SGD, Adam and AdamW.
void write_optimizer_state(const torch::optim::Optimizer& optimizer, core::RecordWriter& out);

// Reads and checks the state in `in` against `optimizer` (same type, groups, group sizes; each
// tensor of its parameter's shape and dtype; finite options) without changing anything, and
// returns the action that installs it. CorruptData naming in.source() for a missing, mistyped
// or contradictory entry; InvalidArgument when the record holds another optimizer type.
std::function<void()> read_optimizer_state(const core::Record& in,
                                           torch::optim::Optimizer& optimizer);

}  // namespace krab::train
