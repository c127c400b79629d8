#include "models/script_modes.h"

#include <torch/csrc/jit/ir/constants.h>
#include <torch/csrc/jit/ir/ir.h>

#include <map>

#include "models/script_inspection.h"

namespace krab::models {
namespace {

// The schema's names for the flag: batch_norm and rrelu say `training`, dropout and the RNNs
// `train`, instance_norm `use_input_stats`.
bool is_mode_flag(const c10::Argument& a) {
  return a.type()->kind() == c10::TypeKind::BoolType &&
         (a.name() == "training" || a.name() == "train" || a.name() == "use_input_stats");
}

// The value of a prim::Constant, or nothing. (c10::optional, not std::optional: IValue converts
// from an empty c10::optional to None, so a std::optional would hold None for every
// non-constant.)
c10::optional<c10::IValue> constant(const torch::jit::Value* v) { return torch::jit::toIValue(v); }

// Whether the flag can change what the call computes (see the header): not for a norm whose
// running statistics are the constant None, nor for a dropout probability of the constant 0.
bool flag_matters(const c10::FunctionSchema& schema, const torch::jit::Node& node) {
  const auto& args = schema.arguments();
  for (size_t i = 0; i < args.size() && i < node.inputs().size(); ++i) {
    const auto c = constant(node.input(i));
    if (!c) continue;
    if (args[i].name() == "running_mean" && c->isNone()) return false;
    if ((args[i].name() == "p" || args[i].name() == "dropout") && c->isDouble() &&
        c->toDouble() == 0.0)
      return false;
  }
  return true;
}

// Each submodule type's path in the module tree ("" for the top), to name a method by the
// submodule the user knows rather than by its mangled class. Traced submodules of the same
// class share a type only when their code is the same; the first path is named.
std::map<std::string, std::string> paths_by_type(const torch::jit::Module& module) {
  std::map<std::string, std::string> paths;
  for (const auto& m : module.named_modules())
    if (const auto name = m.value.type()->name()) paths.emplace(name->qualifiedName(), m.name);
  return paths;
}

std::string where(const torch::jit::Function& fn, const std::map<std::string, std::string>& paths) {
  const c10::QualifiedName& q = fn.qualname();
  const auto at = paths.find(q.prefix());
  if (at == paths.end()) return q.qualifiedName();
  return at->second.empty() ? q.name() : at->second + "." + q.name();
}

}  // namespace

std::vector<FrozenModeCall> frozen_mode_calls(const torch::jit::Module& module) {
  const auto paths = paths_by_type(module);
  std::vector<FrozenModeCall> calls;
  walk_script_graphs(module, [&](const torch::jit::Function& fn, const torch::jit::Node& node) {
    const c10::FunctionSchema* schema = node.maybeSchema();
    if (schema == nullptr) return;
    const auto& args = schema->arguments();
    for (size_t i = 0; i < args.size() && i < node.inputs().size(); ++i) {
      if (!is_mode_flag(args[i])) continue;
      const auto c = constant(node.input(i));
      if (!c || !c->isBool() || !flag_matters(*schema, node)) continue;
      calls.push_back({where(fn, paths), node.kind().toQualString(), args[i].name(), c->toBool()});
    }
  });
  return calls;
}

}  // namespace krab::models
