#include "models/script_units.h"

#include <torch/csrc/jit/ir/ir.h>

#include <algorithm>
#include <map>
#include <unordered_map>

#include "core/errors.h"

namespace krab::models {
namespace {

using torch::jit::Block;
using torch::jit::Node;
using torch::jit::Value;
namespace prim = c10::prim;
namespace attr = c10::attr;

const char* const kMethods[] = {"forward", "training_loss", "predict"};

// The module paths the walks found, with what each walk saw of them.
struct Uses {
  std::map<std::string, std::string> marks;  // paths that are not units: the first reason
  std::vector<std::string> order;            // called paths, in order of their first call
  std::string failure;                       // when set, nothing is split
};

// Where a walk is: `nested` says why a call there may run other than once per run of the top
// method ("" at its top level), `foreign` names the method being walked when it is neither the
// top method nor forward called from it (every module it touches is reached "by something
// else"), `depth` counts method calls.
struct WalkContext {
  std::string nested, foreign;
  int depth = 0;
};

bool is_module_type(const c10::TypePtr& t) {
  if (auto c = t->cast<c10::ClassType>()) return c->is_module();
  if (auto i = t->cast<c10::InterfaceType>()) return i->is_module();
  return false;
}

std::string join(const std::string& parent, const std::string& name) {
  return parent.empty() ? name : parent + "." + name;
}

void mark(Uses& uses, const std::string& path, const std::string& reason) {
  uses.marks.emplace(path, reason);  // keeps the first
}

class MethodWalk {
 public:
  MethodWalk(const torch::jit::Module& root, Uses& uses, std::map<std::string, int>& calls)
      : root_(root), uses_(uses), calls_(calls) {}

  void walk(const std::string& method, const WalkContext& ctx) {
    if (ctx.depth > 16) {
      uses_.failure = "methods of the module call each other more than 16 deep";
      return;
    }
    const auto graph = root_.get_method(method).graph();
    std::unordered_map<const Value*, std::string> paths{{graph->inputs()[0], ""}};
    walk_block(graph->block(), paths, ctx, method);
  }

 private:
  void walk_block(Block* block, std::unordered_map<const Value*, std::string>& paths,
                  const WalkContext& ctx, const std::string& method) {
    for (Node* n : block->nodes()) {
      for (size_t i = 0; i < n->inputs().size(); ++i) {
        const auto at = paths.find(n->inputs()[i]);
        if (at != paths.end()) use(n, i, at->second, paths, ctx, method);
      }
      for (Block* inner : n->blocks()) {
        WalkContext in = ctx;
        if (in.nested.empty())
          in.nested = n->kind() == prim::Loop ? "called inside a loop"
                      : n->kind() == prim::If ? "called inside a branch (if)"
                                              : "called inside a nested block";
        walk_block(inner, paths, in, method);
      }
    }
    // A block's return hands values to the node that owns it: a module leaving a block.
    for (const Value* v : block->return_node()->inputs()) {
      const auto at = paths.find(v);
      if (at != paths.end() && !at->second.empty())
        mark(uses_, at->second, "chosen by control flow");
    }
  }

  // Node n's input i is the module at `path` ("" is self).
  void use(Node* n, size_t i, const std::string& path,
           std::unordered_map<const Value*, std::string>& paths, const WalkContext& ctx,
           const std::string& method) {
    const bool self = path.empty();
    if (n->kind() == prim::GetAttr && i == 0) {
      const std::string child = join(path, n->s(attr::name));
      if (is_module_type(n->output()->type())) {
        paths.emplace(n->output(), child);
        if (!ctx.foreign.empty()) mark(uses_, child, "reached in method " + ctx.foreign);
      } else if (!self) {
        mark(uses_, path, "its attribute " + child + " is read outside its forward");
      }
      return;
    }
    if (n->kind() == prim::CallMethod && i == 0) {
      const std::string name = n->s(attr::name);
      if (self) return call_self(name, ctx, method);
      if (name != "forward") return mark(uses_, path, "its method " + name + " is called");
      return call_child(n, path, ctx);
    }
    if (self && n->kind() == prim::SetAttr) return;  // the root's own attributes
    if (self) {
      uses_.failure = str_cat("self is used by ", n->kind().toQualString(), " in ", method);
      return;
    }
    mark(uses_, path, str_cat("used by ", n->kind().toQualString()));
  }

  void call_self(const std::string& name, const WalkContext& ctx, const std::string& method) {
    WalkContext in = ctx;
    ++in.depth;
    // forward from training_loss / predict: the rewrite points it at __krab_forward, so its
    // calls count as this method's. Any other method is not rewritten: what it reaches is not
    // a unit.
    if (name != "forward" || method == "forward" || !ctx.foreign.empty())
      in.foreign = ctx.foreign.empty() ? name : ctx.foreign;
    walk(name, in);
  }

  void call_child(Node* n, const std::string& path, const WalkContext& ctx) {
    if (!ctx.foreign.empty()) return mark(uses_, path, "called in method " + ctx.foreign);
    if (!ctx.nested.empty()) return mark(uses_, path, ctx.nested);
    if (n->inputs().size() != 2)
      return mark(uses_, path, str_cat("takes ", n->inputs().size() - 1, " inputs"));
    const auto in = n->inputs()[1]->type();
    if (!in->isSubtypeOf(*c10::TensorType::get()))
      return mark(uses_, path, "takes a " + in->repr_str() + ", not a Tensor");
    const auto out = n->outputs().size() == 1 ? n->output()->type() : nullptr;
    if (out && out->cast<c10::TupleType>()) return mark(uses_, path, "returns a tuple");
    if (!out || !out->isSubtypeOf(*c10::TensorType::get()))
      return mark(uses_, path, "returns a " + (out ? out->repr_str() : "list of values"));
    ++calls_[path];
    if (std::find(uses_.order.begin(), uses_.order.end(), path) == uses_.order.end())
      uses_.order.push_back(path);
  }

  const torch::jit::Module& root_;
  Uses& uses_;
  std::map<std::string, int>& calls_;  // this top method's
};

bool overlaps(const std::string& a, const std::string& b) {
  return a != b && (a.rfind(b + ".", 0) == 0 || b.rfind(a + ".", 0) == 0);
}

}  // namespace

ScriptUnitPlan plan_script_units(const torch::jit::Module& module) {
  ScriptUnitPlan plan;
  if (!module.find_method("forward")) return plan;
  Uses uses;
  for (const char* method : kMethods) {
    if (!module.find_method(method)) continue;
    std::map<std::string, int> calls;
    MethodWalk(module, uses, calls).walk(method, {});
    for (const auto& [path, n] : calls)
      if (n > 1) mark(uses, path, str_cat("called ", n, " times in one run of ", method));
  }
  if (!uses.failure.empty()) {
    plan.gathered_whole.push_back("nothing split: " + uses.failure);
    return plan;
  }
  // A unit must own its parameters alone: a path above or below it that is called or reached
  // too would gather, free or recompute some of them a second time.
  std::map<std::string, std::string> whole = uses.marks;
  for (const std::string& path : uses.order)
    for (const std::string& other : uses.order)
      if (overlaps(path, other)) whole.emplace(path, "overlaps " + other + ", which is called too");
  for (const std::string& path : uses.order)
    for (const auto& [other, reason] : uses.marks)
      if (overlaps(path, other))
        whole.emplace(path, str_cat("overlaps ", other, " (", reason, ")"));

  std::map<std::string, torch::jit::Module> modules;
  for (const auto& m : module.named_modules()) modules.emplace(m.name, m.value);
  const auto trainable = [&](const std::string& path) {
    const auto at = modules.find(path);
    if (at == modules.end()) return false;
    for (const at::Tensor& p : at->second.parameters())
      if (p.requires_grad()) return true;
    return false;
  };
  for (const std::string& path : uses.order)
    if (whole.count(path) == 0 && trainable(path)) plan.units.push_back(path);
  for (const auto& [path, reason] : whole)
    if (trainable(path)) plan.gathered_whole.push_back(path + ": " + reason);
  return plan;
}

std::string script_unit_method(const std::string& method) { return "__krab_" + method; }

namespace {

// In a copy of `method`'s graph: each unit's forward call becomes krab::unit_call(x, unit), and
// (outside forward) self.forward becomes self.__krab_forward. The GetAttr chains stay; nothing
// reads them any more, and they have no effect.
void rewrite(torch::jit::Graph& graph, const std::map<std::string, int64_t>& unit_of,
             const std::string& method) {
  std::unordered_map<const Value*, std::string> paths{{graph.inputs()[0], ""}};
  std::vector<std::pair<Node*, int64_t>> calls;
  std::vector<Node*> self_forward;
  std::vector<Block*> todo{graph.block()};
  while (!todo.empty()) {
    Block* block = todo.back();
    todo.pop_back();
    for (Node* n : block->nodes()) {
      for (Block* inner : n->blocks()) todo.push_back(inner);
      if (n->inputs().empty()) continue;
      const auto at = paths.find(n->inputs()[0]);
      if (at == paths.end()) continue;
      if (n->kind() == prim::GetAttr && is_module_type(n->output()->type()))
        paths.emplace(n->output(), join(at->second, n->s(attr::name)));
      if (n->kind() != prim::CallMethod || n->s(attr::name) != "forward") continue;
      if (at->second.empty() && method != "forward") self_forward.push_back(n);
      const auto unit = unit_of.find(at->second);
      if (unit != unit_of.end()) calls.emplace_back(n, unit->second);
    }
  }
  // Nested blocks are pushed before their later siblings are read, but a unit's call is never
  // nested (the plan refuses it) and paths only flow forward, so the order does not matter.
  for (Node* n : self_forward) n->s_(attr::name, script_unit_method("forward"));
  for (const auto& [n, unit] : calls) {
    torch::jit::WithInsertPoint here(n);
    Value* index = graph.insertConstant(unit);
    Node* call = graph.create(c10::Symbol::fromQualString("krab::unit_call"), {n->input(1), index});
    call->insertBefore(n);
    call->output()->setType(n->output()->type());
    n->output()->replaceAllUsesWith(call->output());
    n->destroy();
  }
}

}  // namespace

void apply_script_units(torch::jit::Module& module, const ScriptUnitPlan& plan) {
  KRAB_CHECK(!plan.units.empty(), "apply_script_units: a plan without units");
  std::map<std::string, int64_t> unit_of;
  for (size_t i = 0; i < plan.units.size(); ++i) unit_of.emplace(plan.units[i], i);
  const c10::ClassTypePtr type = module.type();
  const auto cu = module._ivalue()->compilation_unit();
  std::vector<std::string> methods;
  for (const char* method : kMethods) {
    if (!module.find_method(method)) continue;
    if (type->findMethod(script_unit_method(method)) != nullptr)
      throw NotSupported(str_cat("the module already has a method ", script_unit_method(method)));
    methods.push_back(method);
  }
  // forward first: the copies of training_loss and predict call __krab_forward.
  std::vector<std::string> added;
  try {
    for (const std::string& method : methods) {
      const std::string name = script_unit_method(method);
      auto graph = module.get_method(method).graph()->copy();
      rewrite(*graph, unit_of, method);
      type->addMethod(cu->create_function(c10::QualifiedName(*type->name(), name), graph));
      added.push_back(name);
    }
  } catch (...) {
    for (const std::string& name : added) type->unsafeRemoveMethod(name);
    throw;
  }
}

}  // namespace krab::models
