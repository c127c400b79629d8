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
//
// The entries may sit under another prefix than "optimizer" (a sharded checkpoint's shard holds
// one optimizer per unit: "unit.U.optimizer.*"). Sharded checkpoints and the resharding reader
// (train/checkpoint_reader.h) also build an optimizer's state field by field, from pieces of
// other optimizers' states: ParamStateValues and install_param_state() below.
#pragma once

#include <torch/optim/optimizer.h>

#include <functional>
#include <map>
#include <optional>
#include <string>

#include "core/record.h"

namespace krab::train {

// Appends `optimizer`'s state to `out`, entries under `prefix`. NotSupported naming the type
// for an optimizer other than SGD, Adam and AdamW.
void write_optimizer_state(const torch::optim::Optimizer& optimizer, core::RecordEntries& out,
                           const std::string& prefix = "optimizer");
// The type, groups and group options alone (PREFIX.type, PREFIX.groups, PREFIX.group.G.*).
void write_optimizer_options(const torch::optim::Optimizer& optimizer, core::RecordEntries& out,
                             const std::string& prefix = "optimizer");

// Reads and checks the state in `in` against `optimizer` (same type, groups, group sizes; each
// tensor of its parameter's shape and dtype; finite options) without changing anything, and
// returns the action that installs it. CorruptData naming in.source() for a missing, mistyped
// or contradictory entry; InvalidArgument when the record holds another optimizer type.
std::function<void()> read_optimizer_state(const core::Record& in,
                                           torch::optim::Optimizer& optimizer,
                                           const std::string& prefix = "optimizer");

// --- Field by field (resharding) ---------------------------------------------------------------

// "sgd", "adam" or "adamw"; NotSupported for another optimizer.
std::string optimizer_type(const torch::optim::Optimizer& optimizer);
// The per-parameter fields of an optimizer type: SGD {momentum_buffer}; Adam/AdamW {exp_avg,
// exp_avg_sq, max_exp_avg_sq}.
const std::vector<std::string>& state_fields(const std::string& type);

// Group G's options in `in` (PREFIX.group.G.<option>, each finite), by option name; the names
// are the type's (lr momentum dampening weight_decay nesterov | lr beta1 beta2 eps weight_decay
// amsgrad). CorruptData naming in.source() for a missing or non-finite one.
std::map<std::string, double> read_group_options(const core::Record& in, const std::string& type,
                                                 size_t group,
                                                 const std::string& prefix = "optimizer");
// Group `group`'s options of `optimizer`, by the names read_group_options() uses.
std::map<std::string, double> group_options(const torch::optim::Optimizer& optimizer,
                                            size_t group = 0);
// Sets every group of `optimizer` to `options` (as read_group_options returns them).
void set_group_options(torch::optim::Optimizer& optimizer,
                       const std::map<std::string, double>& options);

// One parameter's state, field by field: tensors of the parameter's shape (undefined = absent)
// and Adam's step count (nullopt = never stepped: no state at all).
struct ParamStateValues {
  std::optional<int64_t> step;
  std::map<std::string, at::Tensor> fields;  // by state_fields() name
};
// Replaces `param`'s state in `optimizer` (a parameter of it) with `values`: SGD gets a
// momentum buffer when fields has one, Adam/AdamW a state when step is set (exp_avg and
// exp_avg_sq then required, max_exp_avg_sq optional); otherwise the parameter's state is
// removed. The tensors are installed, not copied — except when the parameter already has a
// state with tensors of the same sizes (made before training: parallel.offload keeps it in a
// memory-mapped file): then `values` are copied into those tensors, an absent field zeroes
// its tensor and an absent step count is 0, so the state stays where it lives.
void install_param_state(torch::optim::Optimizer& optimizer, const at::Tensor& param,
                         const ParamStateValues& values);
// `param`'s state in `optimizer` as install_param_state() takes it: the optimizer's own tensors
// (not copies; an absent field is left out) and Adam's step count; empty when it has none.
ParamStateValues param_state_values(const torch::optim::Optimizer& optimizer,
                                    const at::Tensor& param);

}  // namespace krab::train
