#include "models/torchscript.h"

#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/library.h>
#include <torch/torch.h>

#include <algorithm>
#include <exception>
#include <fstream>
#include <map>
#include <sstream>
#include <utility>

#include "core/errors.h"
#include "core/fs.h"
#include "models/builders.h"
#include "models/forward_error.h"
#include "models/script_deferred.h"
#include "models/script_inspection.h"
#include "models/script_modes.h"

namespace krab::models {
namespace {

namespace F = torch::nn::functional;

// Registers `src`'s own parameters and buffers in `dst` (the same tensors) and mirrors each
// child into a plain torch::nn::Module child of the same name. Registration order follows the
// scripted module's, which is the Python module's: named_parameters() lists them as Python does.
// `seen` maps each tensor registered so far to its full name: a tensor reached under two names
// (tied weights) would be stepped twice by the optimizer and reduced twice, so it is refused.
void mirror(const torch::jit::Module& src, torch::nn::Module& dst, const std::string& prefix,
            std::map<const void*, std::string>& seen, const std::string& path) {
  auto check_once = [&](const at::Tensor& t, const std::string& name) {
    const auto [at, fresh] = seen.emplace(t.unsafeGetTensorImpl(), prefix + name);
    KRAB_CHECK_ARG(fresh, "model.path: '", path, "': ", prefix + name, " is the same tensor as ",
                   at->second, " (tied weights are not supported yet)");
  };
  for (const auto& p : src.named_parameters(/*recurse=*/false)) {
    check_once(p.value, p.name);
    dst.register_parameter(p.name, p.value, p.value.requires_grad());
  }
  for (const auto& b : src.named_buffers(/*recurse=*/false)) {
    check_once(b.value, b.name);
    dst.register_buffer(b.name, b.value);
  }
  for (const auto& child : src.named_children()) {
    auto m = std::make_shared<torch::nn::Module>();
    mirror(child.value, *m, prefix + child.name + ".", seen, path);
    dst.register_module(child.name, m);
  }
}

// torch::jit::load compiles the file's code and runs its __setstate__ methods, so the file is
// inspected before it (script_inspection.h), and the compiled graphs after it, before any method
// runs; unless the user vouches for the file.
// With `deferred`, through it: the tensors' bytes are not read (script_deferred.h), unless
// the loaded module does not hold every storage whose read was skipped; then it is loaded
// again, whole, and `deferred` holds nothing.
torch::jit::Module load_script(const ModelSpec& spec,
                               const std::shared_ptr<DeferredTensorReads>& deferred) {
  const std::string& path = spec.path;
  KRAB_CHECK_ARG(core::path_exists(path), "model.path: no file '", path, "'");
  const std::string source = str_cat("model.path: '", path, "'");
  const std::string advice =
      "set model.trust_code: true to load it anyway if you vouch for the file";
  if (deferred) {
    torch::jit::Module m = spec.trust_code
                               ? load_torchscript_unchecked(deferred, source)
                               : load_inspected_torchscript_file(path, source, advice, deferred);
    if (deferred->keep_reachable(m)) return m;
  }
  if (!spec.trust_code) return load_inspected_torchscript_file(path, source, advice);
  std::ifstream in(path, std::ios::binary);
  return load_torchscript_unchecked(in, source);
}

std::shared_ptr<DeferredTensorReads> deferred_reads(const ModelSpec& spec,
                                                    TorchScriptModel::ParameterValues values) {
  if (values != TorchScriptModel::ParameterValues::kDeferred || !core::path_exists(spec.path))
    return nullptr;  // load_script names a missing file
  try {
    return std::make_shared<DeferredTensorReads>(spec.path,
                                                 str_cat("model.path: '", spec.path, "'"));
  } catch (const Error&) {
    return nullptr;  // read whole: the load says what is wrong with the file, as without
  }
}

// Classes whose buffers are all persistent: torch.nn's and torchvision's own (none of them
// registers one with persistent=False, as of torch 1.13 and torchvision 0.14).
bool buffers_known_persistent(const torch::jit::Module& m) {
  const auto name = m.type()->name();
  if (!name) return false;
  const std::string q = name->qualifiedName();
  return q.rfind("__torch__.torch.nn.", 0) == 0 || q.rfind("__torch__.torchvision.", 0) == 0;
}

// `names` joined by ", ", at most `most` of them and then how many more.
std::string list_of(const std::vector<std::string>& names, size_t most = 6) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < most; ++i) out += (i ? ", " : "") + names[i];
  if (names.size() > most) out += str_cat(" and ", names.size() - most, " more");
  return out;
}

bool is_batchnorm(const torch::jit::Module& m) {
  const auto name = m.type()->name();
  return name && name->name().find("BatchNorm") != std::string::npos;
}

std::string shape_of(const at::Tensor& t) { return str_cat(t.sizes()); }

// The model whose method runs on this thread (innermost), for krab::unit_call's kernel, and a
// krab error the kernel threw: the interpreter rethrows whatever a kernel throws as a
// std::runtime_error holding a traceback, and run() restores the original type from here (a
// runner's Timeout or PeerLost must stay one).
thread_local TorchScriptModel* running_model = nullptr;
thread_local std::exception_ptr unit_failure;

class RunningModel {
 public:
  explicit RunningModel(TorchScriptModel* m) : previous_(running_model) { running_model = m; }
  ~RunningModel() { running_model = previous_; }
  RunningModel(const RunningModel&) = delete;
  RunningModel& operator=(const RunningModel&) = delete;

 private:
  TorchScriptModel* previous_;
};

at::Tensor unit_call(const at::Tensor& x, int64_t unit) {
  KRAB_CHECK(running_model != nullptr, "krab::unit_call ran outside TorchScriptModel::run");
  try {
    return running_model->run_script_unit(unit, x);
  } catch (const Error&) {
    unit_failure = std::current_exception();
    throw;
  }
}

}  // namespace

// One operator of krab's own, which only the rewritten copies of a module's methods call
// (models/script_units.h). A catch-all kernel: autograd records the ops the unit runs inside
// it, so the operator needs no derivative. CONSERVATIVE: the optimiser may neither drop nor
// merge calls of it, since each call runs a unit through the runner.
TORCH_LIBRARY_FRAGMENT(krab, m) {
  m.def(torch::schema("krab::unit_call(Tensor x, int unit) -> Tensor",
                      c10::AliasAnalysisKind::CONSERVATIVE),
        &unit_call);
}

bool is_known_loss(const std::string& name) {
  return name == "cross_entropy" || name == "mse" || name == "bce_with_logits" || name == "nll";
}

TorchScriptModel::TorchScriptModel(const ModelSpec& spec)
    : TorchScriptModel(spec, ParameterValues::kRead) {}

TorchScriptModel::TorchScriptModel(const ModelSpec& spec, ParameterValues values)
    : file_(core::path_exists(spec.path) ? script_file_of(spec.path) : ScriptFile{}),
      deferred_(deferred_reads(spec, values)),
      module_(load_script(spec, deferred_)),
      path_(spec.path),
      loss_(spec.loss),
      freeze_batchnorm_(spec.freeze_batchnorm),
      trust_code_(spec.trust_code) {
  KRAB_CHECK_ARG(is_known_loss(loss_), "train.loss: unknown loss '", loss_,
                 "'; known: cross_entropy, mse, bce_with_logits, nll");
  KRAB_CHECK_ARG(module_.find_method("forward").has_value(), "model.path: '", path_,
                 "' has no forward method");
  has_training_loss_ = module_.find_method("training_loss").has_value();
  has_predict_ = module_.find_method("predict").has_value();
  std::map<const void*, std::string> seen;
  mirror(module_, *this, "", seen, path_);
  int64_t trainable = 0;
  for (const at::Tensor& p : parameters()) trainable += p.requires_grad() ? p.numel() : 0;
  KRAB_CHECK_ARG(trainable > 0, "model.path: '", path_,
                 "' has no trainable parameters (none with requires_grad)");
  // Every engine keeps gradients in flat float32 buckets (DataParallel, compressors, servers).
  for (const auto& item : named_parameters())
    KRAB_CHECK_ARG(item.value().scalar_type() == at::kFloat, "model.path: '", path_,
                   "': parameter ", item.key(), " is ", item.value().scalar_type(),
                   "; krab trains float32 parameters (call .float() before saving)");
  check_modes();
  warn_unrecorded_buffers();
  split_units();
  if (deferred_) read_all_but_trainable();
}

// Every tensor of the module object that no engine overwrites: buffers, frozen parameters and
// tensor attributes, which the engines broadcast from rank 0 or never touch.
void TorchScriptModel::read_all_but_trainable() {
  std::vector<at::Tensor> trainable;
  for (const at::Tensor& p : parameters())
    if (p.requires_grad()) trainable.push_back(p);
  deferred_->fill_all_except(trainable);
}

void TorchScriptModel::read_units(BuildObserver& observer) {
  // Without the root itself: a model need not be held by a shared_ptr.
  const auto modules = named_modules("", /*include_self=*/false);
  for (const std::string& path : unit_candidates()) {
    const auto* found = modules.find(path);
    KRAB_CHECK(found != nullptr, "unit candidate '", path, "' is not a submodule");
    if (deferred_)
      for (const at::Tensor& p : (*found)->parameters()) deferred_->fill(p);
    observer.on_unit_built(path, **found);
  }
  if (deferred_) deferred_->fill_all();
  deferred_.reset();
  observer.on_unit_built("", *this);
}

// After the inspection (in load_script) and the checks: they read the user's code as loaded.
void TorchScriptModel::split_units() {
  ScriptUnitPlan plan = plan_script_units(module_);
  if (plan.units.empty()) {
    units_ = std::move(plan);
    return;
  }
  try {
    for (const std::string& path : plan.units) {
      torch::jit::Module m = module_;
      for (size_t at = 0, dot; at <= path.size(); at = dot + 1) {
        dot = std::min(path.find('.', at), path.size());
        m = m.attr(path.substr(at, dot - at)).toModule();
      }
      unit_modules_.push_back(m);
    }
    apply_script_units(module_, plan);
    units_ = std::move(plan);
  } catch (const std::exception& e) {
    // A module the rewrite cannot handle still trains, whole: say why.
    unit_modules_.clear();
    units_ = ScriptUnitPlan{};
    units_.gathered_whole.push_back(str_cat("nothing split: ", e.what()));
  }
}

at::Tensor TorchScriptModel::run_script_unit(int64_t unit, const at::Tensor& x) {
  KRAB_CHECK(unit >= 0 && unit < static_cast<int64_t>(unit_modules_.size()),
             "krab::unit_call: no unit ", unit);
  torch::jit::Module child = unit_modules_[unit];
  return run_unit(static_cast<int>(unit), x, [child](const at::Tensor& h) mutable {
    // Also here, not only in run(): a runner may call this again in backward (recompute),
    // outside run()'s guard, and must get the same ops.
    torch::jit::GraphOptimizerEnabledGuard eager_autograd(false);
    return child.forward({h}).toTensor();
  });
}

// A correctness check, not a security one: it runs with model.trust_code too.
void TorchScriptModel::check_modes() {
  std::vector<std::string> frozen_off;
  for (const FrozenModeCall& call : frozen_mode_calls(module_)) {
    const std::string what = str_cat(call.where, " calls ", call.op, " with ", call.argument,
                                     " fixed to ", call.value ? "true" : "false");
    // Evaluation and model.ts would keep the train-mode computation: an accuracy that the
    // module in eval mode, in Python or from model.ts, does not reproduce.
    KRAB_CHECK_ARG(!call.value, "model.path: '", path_, "': ", what,
                   " (torch.jit.trace of the module in train mode), which eval() cannot reach; "
                   "script it with torch.jit.script, or trace it after model.eval()");
    frozen_off.push_back(str_cat(call.where, " (", call.op, ")"));
  }
  // Traced in eval mode: training runs the eval computation, which evaluation and Python's
  // module in eval mode reproduce; only what training does differs from Python's, so say it.
  if (!frozen_off.empty())
    warnings_.push_back(str_cat(
        "model.path '", path_, "' was traced in eval mode: ", list_of(frozen_off),
        " run as in eval in training too (BatchNorm normalises with its running statistics and "
        "never updates them, dropout is off), unlike your Python module in train mode; script it "
        "with torch.jit.script for train-mode behaviour"));
}

void TorchScriptModel::warn_unrecorded_buffers() {
  std::vector<std::string> names;
  for (const auto& m : module_.named_modules()) {
    if (buffers_known_persistent(m.value)) continue;
    for (const auto& b : m.value.named_buffers(/*recurse=*/false))
      names.push_back(m.name.empty() ? b.name : m.name + "." + b.name);
  }
  // TorchScript lists a buffer registered with persistent=False as any other (torch.jit.script
  // does not carry Python's _non_persistent_buffers_set into the module's type), so model.pt
  // holds it and load_state_dict(strict=True) into the Python class fails on it.
  if (!names.empty())
    warnings_.push_back(str_cat(
        "model.path '", path_, "': model.pt will hold the buffers ", list_of(names),
        " of your own classes: TorchScript does not record which buffers are non-persistent "
        "(register_buffer(..., "
        "persistent=False)), so if one of them is, drop it from model.pt's dictionary before "
        "load_state_dict(..., strict=True) (docs/models.md)"));
}

at::Tensor TorchScriptModel::run(const char* method, std::vector<c10::IValue> args) {
  KRAB_CHECK(!deferred_, "model.path: '", path_, "': ", method,
             " ran before the parameters were read (TorchScriptModel::read_units)");
  // The graph executor's optimised plan replaces runs of differentiable ops with autodiff
  // subgraphs whose symbolic gradients are slower on CPU than eager autograd's kernels (relu's
  // backward becomes grad * (out > 0).type_as(out): three passes over the activations instead
  // of one threshold_backward). Unoptimised, the interpreter dispatches the same ops, with the
  // same autograd, as the Python module in eager mode and as the built-in models do.
  torch::jit::GraphOptimizerEnabledGuard eager_autograd(false);
  RunningModel running(this);
  unit_failure = nullptr;
  c10::IValue out;
  try {
    const std::string name = units_.units.empty() ? method : script_unit_method(method);
    out = module_.get_method(name)(std::move(args));
  } catch (const Error&) {
    throw;
  } catch (const std::bad_alloc&) {
    throw;  // out of memory is not the model's mistake
  } catch (const std::exception& e) {
    if (unit_failure) std::rethrow_exception(std::exchange(unit_failure, nullptr));
    // An op failing inside the interpreter arrives as a std::runtime_error holding two
    // tracebacks before the cause (models/forward_error.h); keep the cause, set the rest aside.
    LibraryError failure = describe_library_error(e);
    throw ForwardError(str_cat("model.path: '", path_, "': ", method, " failed: ", failure.cause),
                       failure.cause, failure.details);
  }
  KRAB_CHECK_ARG(out.isTensor(), "model.path: '", path_, "': ", method, " returned a ",
                 out.tagKind(), ", not a Tensor");
  return out.toTensor();
}

at::Tensor TorchScriptModel::forward(const at::Tensor& inputs) { return run("forward", {inputs}); }

at::Tensor TorchScriptModel::predict(const at::Tensor& inputs) {
  return run(has_predict_ ? "predict" : "forward", {inputs});
}

at::Tensor TorchScriptModel::training_loss(const at::Tensor& inputs, const at::Tensor& targets) {
  if (!has_training_loss_) return loss(forward(inputs), targets);
  at::Tensor l = run("training_loss", {inputs, targets});
  KRAB_CHECK_ARG(l.numel() == 1, "model.path: '", path_, "': training_loss returned shape ",
                 shape_of(l), ", not a scalar");
  return l.reshape({});
}

void TorchScriptModel::check_class_shapes(const at::Tensor& outputs,
                                          const at::Tensor& targets) const {
  std::vector<int64_t> want = targets.sizes().vec();
  want.push_back(outputs.dim() > 0 ? outputs.size(-1) : 0);
  KRAB_CHECK_ARG(outputs.dim() == targets.dim() + 1 && outputs.sizes().vec() == want,
                 "model.path: '", path_, "': forward(x) returned shape ", shape_of(outputs),
                 " but train.loss ", loss_, " needs ", shape_of(targets),
                 " + [classes] for labels of shape ", shape_of(targets));
}

at::Tensor TorchScriptModel::loss(const at::Tensor& outputs, const at::Tensor& targets) {
  if (loss_ == "cross_entropy" || loss_ == "nll") {
    check_class_shapes(outputs, targets);
    const at::Tensor flat = outputs.reshape({-1, outputs.size(-1)});
    const at::Tensor labels = targets.reshape({-1}).to(at::kLong);
    return loss_ == "nll" ? F::nll_loss(flat, labels) : F::cross_entropy(flat, labels);
  }
  at::Tensor out = outputs;
  if (out.dim() == 2 && out.size(1) == 1 && targets.dim() == 1) out = out.squeeze(1);
  KRAB_CHECK_ARG(out.sizes() == targets.sizes(), "model.path: '", path_,
                 "': forward(x) returned shape ", shape_of(outputs), " but train.loss ", loss_,
                 " needs the labels' shape ", shape_of(targets));
  const at::Tensor y = targets.to(out.scalar_type());
  return loss_ == "mse" ? F::mse_loss(out, y) : F::binary_cross_entropy_with_logits(out, y);
}

void TorchScriptModel::train(bool on) {
  Model::train(on);
  module_.train(on);
  if (on && freeze_batchnorm_)
    for (torch::jit::Module m : module_.modules())
      if (is_batchnorm(m)) m.train(false);
}

void TorchScriptModel::check_fits(const at::Tensor& inputs, const at::Tensor& targets,
                                  const at::Tensor& all_targets) {
  torch::NoGradGuard no_grad;
  eval();  // a check must not move BatchNorm's running statistics
  if (has_training_loss_) {
    training_loss(inputs, targets);
    return;
  }
  const at::Tensor outputs = forward(inputs);
  if (loss_ == "cross_entropy" || loss_ == "nll") {
    check_class_shapes(outputs, targets);  // before the range: C is outputs' last dimension
    const int64_t classes = outputs.size(-1);
    const int64_t lo = all_targets.min().item<int64_t>(), hi = all_targets.max().item<int64_t>();
    KRAB_CHECK_ARG(lo >= 0 && hi < classes, "model.path: '", path_, "': forward(x) gives ", classes,
                   " classes but the data's labels go from ", lo, " to ", hi, " (train.loss ",
                   loss_, " needs labels in [0, ", classes, "))");
  }
  loss(outputs, targets);  // throws naming both shapes when they do not fit
}

void TorchScriptModel::save(const std::string& path) const {
  // The weights by name from the mirror (the same tensors the scripted module trains).
  std::map<std::string, at::Tensor> mine;
  for (const auto& item : named_parameters()) mine.emplace(item.key(), item.value());
  for (const auto& item : named_buffers()) mine.emplace(item.key(), item.value());
  save_script_with_weights(
      file_, trust_code_,
      [&](const std::string& name, at::Tensor& t) {
        const auto it = mine.find(name);
        KRAB_CHECK(it != mine.end() && it->second.sizes() == t.sizes(), "model.ts: '", name,
                   "' of the reloaded file is not the model's");
        t.copy_(it->second);
      },
      path, "set model.trust_code: true to load it anyway if you vouch for the file");
}

TorchScriptModel* as_torchscript(Model& model) { return dynamic_cast<TorchScriptModel*>(&model); }

namespace detail {
std::shared_ptr<Model> make_torchscript(const ModelSpec& spec) {
  return std::make_shared<TorchScriptModel>(spec);
}
}  // namespace detail

int64_t TorchScriptModel::deferred_bytes() const {
  return deferred_ ? deferred_->deferred_bytes() : 0;
}

}  // namespace krab::models
