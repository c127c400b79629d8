// A user's own network, saved from Python as TorchScript, trained as a krab model.
//
//   model: {name: torchscript, path: net.ts}     # torch.jit.script(m).save("net.ts")
//
// A TorchScript file is a program: unless spec.trust_code (model.trust_code), the file is
// inspected before torch::jit::load reads it and its compiled graphs before any method runs, and
// code that reaches files, processes or the network is refused (models/script_inspection.h).
//
// The scripted module is loaded with torch::jit::load and wrapped in a Model whose
// torch::nn::Module tree mirrors the scripted module's submodule tree: every parameter and
// buffer of the scripted module is registered in the mirror under its own name, as the SAME
// tensor (no copy). So named_parameters() / named_buffers() keep the Python names
// ("layer1.0.conv1.weight", "bn1.running_mean", "bn1.num_batches_tracked"), and whatever
// updates the mirror's tensors in place — the optimizer, DataParallel's broadcasts, local SGD's
// averages, checkpoint restores — updates the tensors the scripted code computes with.
// model.pt written from the mirror loads into the Python module with
// load_state_dict(strict=True), except for buffers registered with persistent=False: the file
// does not record which those are, so the mirror holds them, model.pt too, and warnings() names
// the buffers that may be such.
//
// What the module may define (all optional except forward):
//   forward(x) -> Tensor               the outputs train.loss is applied to;
//   training_loss(x, y) -> Tensor      a scalar loss: replaces forward + train.loss in
//                                      training, so any loss written in Python works;
//   predict(x) -> Tensor               the outputs evaluation compares with the labels
//                                      (argmax over the last dimension); forward if absent.
//
// The methods run with the graph executor's optimisations off: the scripted ops, with eager
// autograd, as the Python module runs in eager mode (as fast as the built-in models on CPU:
// docs/benchmarks.md, "Own model speed").
//
// train() / eval() reach the scripted module (its `training` flags: dropout, BatchNorm). With
// freeze_batchnorm, BatchNorm submodules stay in eval mode while the rest trains: they
// normalise with their running statistics and do not update them (as when fine-tuning), so one
// example's gradient does not depend on the others in its batch — the condition under which the
// determinism contract (W workers x B == 1 worker x W*B) holds for a model with BatchNorm.
//
// Units (models/units.h, docs/design/zero-sharding.md §3.3): after loading and inspecting the
// file, the model plans which children can be units (models/script_units.h) and, when any can,
// adds rewritten copies of forward, training_loss and predict (`__krab_forward`, ...) that run
// each unit through Model::run_unit, and runs those copies from then on. Without a runner they
// compute what the originals compute, bit for bit. unit_candidates() lists the units;
// gathered_whole() says why each other child holding parameters is not one.
//
// Loaded for sharding (ZeRO stage 3, docs/design/zero-sharding.md §3.4): with
// ParameterValues::kDeferred the file is loaded without reading its trainable parameters' bytes
// (models/script_deferred.h): their storages are reserved, not written, and hold indeterminate
// values; every other tensor (buffers, frozen parameters, tensor attributes) is read at once.
// read_units(observer) then reads the parameters unit by unit, telling the observer of each
// unit once its values are in, as make_model tells of a built-in model's units
// (models/units.h), so that a sharding engine keeps its shard and frees the rest before the
// next unit is read: no rank ever holds the whole model. Until read_units has run, running a
// method is an Error.
//
// Thread safety: as for any torch module.
#pragma once

#include <torch/script.h>

#include <memory>
#include <string>
#include <vector>

#include "models/model.h"
#include "models/script_file.h"
#include "models/script_units.h"
#include "models/units.h"

namespace krab::models {

class DeferredTensorReads;  // models/script_deferred.h

// The losses train.loss names: cross_entropy | mse | bce_with_logits | nll.
bool is_known_loss(const std::string& name);

class TorchScriptModel : public Model {
 public:
  // Loads spec.path. InvalidArgument naming model.path for: a missing or unreadable file, a
  // file that is not TorchScript, code that the inspection refuses (unless spec.trust_code;
  // the message names the record, line and operator), a module without a forward method, a
  // module without any parameter that requires a gradient, a call whose train/eval flag is
  // fixed to true (a torch.jit.trace in train mode: models/script_modes.h; checked with
  // trust_code too; the message names the submodule, the operator and the fix); CorruptData
  // naming model.path for an archive whose stated sizes its bytes do not back; InvalidArgument
  // naming train.loss for an unknown loss.
  explicit TorchScriptModel(const ModelSpec& spec);
  // What the constructor reads of the trainable parameters' values: all of them, or none until
  // read_units (above).
  enum class ParameterValues { kRead, kDeferred };
  TorchScriptModel(const ModelSpec& spec, ParameterValues values);

  // Once: reads the parameters of each unit candidate in forward order (kDeferred) and calls
  // observer.on_unit_built(path, submodule) after each, then reads the rest and calls
  // observer.on_unit_built("", *this) (models/units.h's BuildObserver order). For a model whose
  // values were read (kRead, or a file the deferred load could not plan: then it is read
  // whole) only the calls. What the observer throws goes through.
  void read_units(BuildObserver& observer);
  // Bytes of trainable parameters not read yet (kDeferred before read_units; 0 otherwise).
  int64_t deferred_bytes() const;

  at::Tensor forward(const at::Tensor& inputs) override;
  // train.loss of `outputs` against `targets`. Shapes (InvalidArgument naming model.path and
  // both shapes otherwise): cross_entropy / nll: targets of class indices [...], outputs
  // [..., C] (nll: log-probabilities); mse / bce_with_logits: outputs of the targets' shape,
  // or [B, 1] for targets [B]. Targets are cast to the outputs' dtype for mse / bce.
  at::Tensor loss(const at::Tensor& outputs, const at::Tensor& targets) override;
  at::Tensor training_loss(const at::Tensor& inputs, const at::Tensor& targets) override;
  at::Tensor predict(const at::Tensor& inputs) override;
  void train(bool on = true) override;

  // Checks the model against a first batch and the data's labels before any training:
  // outputs that fit the labels (names the expected and actual shapes) and, for
  // cross_entropy / nll, labels in [0, C) (names the largest label and C). Leaves the model in
  // eval mode; running statistics untouched.
  void check_fits(const at::Tensor& inputs, const at::Tensor& targets,
                  const at::Tensor& all_targets);

  // Writes the scripted module, holding the current weights, in eval mode, to `path`
  // atomically (torch.jit.load reads it), through models/script_file.h: the file the run
  // loaded, loaded again and filled with these weights, so it holds the user's methods only —
  // never a `__krab_` copy, nor any call of a krab operator, which Python could not load.
  // InvalidArgument naming the file when it is missing or changed since the run loaded it
  // (script_file_change(file()) says so beforehand).
  void save(const std::string& path) const;

  // The file as loaded: absolute path and SHA-256 (checkpoints record both, for export).
  const ScriptFile& file() const { return file_; }
  bool trusted() const { return trust_code_; }

  // What the user should read once about this file, one line each, without a prefix (the
  // launcher, fl-sim and fl-server print them as "krab: warning: ..."): buffers of the user's
  // own classes, which model.pt holds although any of them may be non-persistent in Python (the
  // file cannot tell); calls whose train/eval flag a trace in eval mode fixed to false.
  const std::vector<std::string>& warnings() const { return warnings_; }

  // The children run through run_unit, in forward order ("layer1", "blocks.0"); empty when
  // nothing could be split.
  std::vector<std::string> unit_candidates() const override { return units_.units; }
  // Why each child holding parameters is not a unit, one line each ("head: returns a tuple"),
  // for the report; a line without a path when the rewrite itself failed.
  const std::vector<std::string>& gathered_whole() const { return units_.gathered_whole; }

  // For the krab::unit_call operator only: runs unit `unit` on x through run_unit.
  at::Tensor run_script_unit(int64_t unit, const at::Tensor& x);

  const std::string& path() const { return path_; }
  bool has_training_loss() const { return has_training_loss_; }
  bool has_predict() const { return has_predict_; }

 private:
  at::Tensor run(const char* method, std::vector<c10::IValue> args);
  // cross_entropy / nll: outputs [..., C] for labels [...]; InvalidArgument naming both.
  void check_class_shapes(const at::Tensor& outputs, const at::Tensor& targets) const;
  // Refuses a train/eval flag that a trace in train mode fixed to true (models/script_modes.h);
  // warns of the ones fixed to false.
  void check_modes();
  void warn_unrecorded_buffers();
  // Plans the units and adds the rewritten methods; on any failure, no units and the reason.
  void split_units();
  // kDeferred: reads every deferred tensor but the trainable parameters.
  void read_all_but_trainable();

  ScriptFile file_;  // hashed before module_ loads it
  // kDeferred until read_units: the reads of the trainable parameters not made yet.
  std::shared_ptr<DeferredTensorReads> deferred_;
  torch::jit::Module module_;
  std::string path_, loss_;
  bool freeze_batchnorm_ = false;
  bool trust_code_ = false;
  bool has_training_loss_ = false, has_predict_ = false;
  std::vector<std::string> warnings_;
  ScriptUnitPlan units_;
  std::vector<torch::jit::Module> unit_modules_;  // units_.units[i]'s module
};

// The model as a TorchScriptModel, or null for a built-in model.
TorchScriptModel* as_torchscript(Model& model);

}  // namespace krab::models
