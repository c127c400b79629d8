#include "train/optimizer_state.h"

#include <ATen/core/grad_mode.h>
#include <c10/util/Type.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <memory>
#include <typeinfo>
#include <utility>
#include <vector>

#include "core/errors.h"
#include "core/printable.h"

namespace krab::train {
namespace {

using torch::optim::Optimizer;
using torch::optim::OptimizerOptions;
using torch::optim::OptimizerParamState;

enum class Type { kSgd, kAdam, kAdamW };

const char* type_name(Type t) {
  return t == Type::kSgd ? "sgd" : t == Type::kAdam ? "adam" : "adamw";
}

Type type_of(const Optimizer& o) {
  if (dynamic_cast<const torch::optim::SGD*>(&o)) return Type::kSgd;
  if (dynamic_cast<const torch::optim::Adam*>(&o)) return Type::kAdam;
  if (dynamic_cast<const torch::optim::AdamW*>(&o)) return Type::kAdamW;
  throw NotSupported(str_cat("checkpoints hold the state of SGD, Adam and AdamW; optimizer ",
                             c10::demangle(typeid(o).name()), " cannot be saved or restored"));
}

std::string group_key(const std::string& prefix, size_t g, const char* field) {
  return str_cat(prefix, ".group.", g, ".", field);
}
std::string state_key(const std::string& prefix, size_t k, const char* field) {
  return str_cat(prefix, ".state.", k, ".", field);
}

// How LibTorch keys Optimizer::state(): the parameter's TensorImpl address as text.
std::string state_id(const at::Tensor& p) { return c10::guts::to_string(p.unsafeGetTensorImpl()); }

// --- Options -----------------------------------------------------------------------------------
// Each optimizer's options as (name, getter, setter) over doubles, so that writing and reading
// walk the same list.
template <typename Options>
struct Field {
  const char* name;
  double (*get)(const Options&);
  void (*set)(Options&, double);
};

const std::vector<Field<torch::optim::SGDOptions>>& sgd_fields() {
  using O = torch::optim::SGDOptions;
  static const std::vector<Field<O>> f = {
      {"lr", [](const O& o) { return o.lr(); }, [](O& o, double v) { o.lr(v); }},
      {"momentum", [](const O& o) { return o.momentum(); }, [](O& o, double v) { o.momentum(v); }},
      {"dampening", [](const O& o) { return o.dampening(); },
       [](O& o, double v) { o.dampening(v); }},
      {"weight_decay", [](const O& o) { return o.weight_decay(); },
       [](O& o, double v) { o.weight_decay(v); }},
      {"nesterov", [](const O& o) { return o.nesterov() ? 1.0 : 0.0; },
       [](O& o, double v) { o.nesterov(v != 0); }},
  };
  return f;
}

// Adam and AdamW have the same options in two unrelated types.
template <typename O>
const std::vector<Field<O>>& adam_fields() {
  static const std::vector<Field<O>> f = {
      {"lr", [](const O& o) { return o.lr(); }, [](O& o, double v) { o.lr(v); }},
      {"beta1", [](const O& o) { return std::get<0>(o.betas()); },
       [](O& o, double v) {
         o.betas({v, std::get<1>(o.betas())});
       }},
      {"beta2", [](const O& o) { return std::get<1>(o.betas()); },
       [](O& o, double v) {
         o.betas({std::get<0>(o.betas()), v});
       }},
      {"eps", [](const O& o) { return o.eps(); }, [](O& o, double v) { o.eps(v); }},
      {"weight_decay", [](const O& o) { return o.weight_decay(); },
       [](O& o, double v) { o.weight_decay(v); }},
      {"amsgrad", [](const O& o) { return o.amsgrad() ? 1.0 : 0.0; },
       [](O& o, double v) { o.amsgrad(v != 0); }},
  };
  return f;
}

template <typename O>
void write_options(const std::vector<Field<O>>& fields, const OptimizerOptions& options, size_t g,
                   core::RecordEntries& out, const std::string& prefix) {
  for (const auto& f : fields)
    out.add_double(group_key(prefix, g, f.name), f.get(static_cast<const O&>(options)));
}

template <typename O>
std::unique_ptr<OptimizerOptions> read_options(const std::vector<Field<O>>& fields,
                                               const OptimizerOptions& current, size_t g,
                                               const core::Record& in, const std::string& prefix) {
  auto options = current.clone();
  for (const auto& f : fields) {
    const double v = in.real(group_key(prefix, g, f.name));
    if (!std::isfinite(v))
      throw CorruptData(str_cat(in.source(), ": ", group_key(prefix, g, f.name), " is ", v));
    f.set(static_cast<O&>(*options), v);
  }
  return options;
}

// --- Per-parameter state -----------------------------------------------------------------------

const at::Tensor& like(const core::Record& in, const std::string& key, const at::Tensor& param) {
  const at::Tensor& t = in.tensor(key);
  if (t.sizes() != param.sizes() || t.scalar_type() != param.scalar_type())
    throw CorruptData(str_cat(in.source(), ": '", key, "' is ", t.sizes(), " ", t.scalar_type(),
                              ", its parameter ", param.sizes(), " ", param.scalar_type()));
  return t;
}

void write_sgd_state(const OptimizerParamState& s, size_t k, core::RecordEntries& out,
                     const std::string& prefix) {
  const auto& st = static_cast<const torch::optim::SGDParamState&>(s);
  if (st.momentum_buffer().defined())
    out.add_tensor(state_key(prefix, k, "momentum_buffer"), st.momentum_buffer());
}

std::unique_ptr<OptimizerParamState> read_sgd_state(const core::Record& in, size_t k,
                                                    const at::Tensor& param,
                                                    const std::string& prefix) {
  if (!in.has(state_key(prefix, k, "momentum_buffer"))) return nullptr;
  auto st = std::make_unique<torch::optim::SGDParamState>();
  st->momentum_buffer(like(in, state_key(prefix, k, "momentum_buffer"), param));
  return st;
}

template <typename S>
void write_adam_state(const OptimizerParamState& s, size_t k, core::RecordEntries& out,
                      const std::string& prefix) {
  const auto& st = static_cast<const S&>(s);
  out.add_int(state_key(prefix, k, "step"), st.step());
  out.add_tensor(state_key(prefix, k, "exp_avg"), st.exp_avg());
  out.add_tensor(state_key(prefix, k, "exp_avg_sq"), st.exp_avg_sq());
  if (st.max_exp_avg_sq().defined())
    out.add_tensor(state_key(prefix, k, "max_exp_avg_sq"), st.max_exp_avg_sq());
}

template <typename S>
std::unique_ptr<OptimizerParamState> read_adam_state(const core::Record& in, size_t k,
                                                     const at::Tensor& param,
                                                     const std::string& prefix) {
  if (!in.has(state_key(prefix, k, "step"))) return nullptr;
  auto st = std::make_unique<S>();
  const int64_t step = in.integer(state_key(prefix, k, "step"));
  if (step < 0)
    throw CorruptData(str_cat(in.source(), ": ", state_key(prefix, k, "step"), " is ", step));
  st->step(step);
  st->exp_avg(like(in, state_key(prefix, k, "exp_avg"), param));
  st->exp_avg_sq(like(in, state_key(prefix, k, "exp_avg_sq"), param));
  if (in.has(state_key(prefix, k, "max_exp_avg_sq")))
    st->max_exp_avg_sq(like(in, state_key(prefix, k, "max_exp_avg_sq"), param));
  return st;
}

}  // namespace

void write_optimizer_options(const Optimizer& optimizer, core::RecordEntries& out,
                             const std::string& prefix) {
  const Type type = type_of(optimizer);
  out.add_string(prefix + ".type", type_name(type));
  const auto& groups = optimizer.param_groups();
  out.add_int(prefix + ".groups", static_cast<int64_t>(groups.size()));
  for (size_t g = 0; g < groups.size(); ++g) {
    out.add_int(group_key(prefix, g, "params"), static_cast<int64_t>(groups[g].params().size()));
    if (type == Type::kSgd) write_options(sgd_fields(), groups[g].options(), g, out, prefix);
    if (type == Type::kAdam)
      write_options(adam_fields<torch::optim::AdamOptions>(), groups[g].options(), g, out, prefix);
    if (type == Type::kAdamW)
      write_options(adam_fields<torch::optim::AdamWOptions>(), groups[g].options(), g, out, prefix);
  }
}

void write_optimizer_state(const Optimizer& optimizer, core::RecordEntries& out,
                           const std::string& prefix) {
  write_optimizer_options(optimizer, out, prefix);
  const Type type = type_of(optimizer);
  size_t k = 0;
  for (const auto& group : optimizer.param_groups())
    for (const auto& p : group.params()) {
      const auto it = optimizer.state().find(state_id(p));
      if (it != optimizer.state().end()) {
        if (type == Type::kSgd) write_sgd_state(*it->second, k, out, prefix);
        if (type == Type::kAdam)
          write_adam_state<torch::optim::AdamParamState>(*it->second, k, out, prefix);
        if (type == Type::kAdamW)
          write_adam_state<torch::optim::AdamWParamState>(*it->second, k, out, prefix);
      }
      ++k;
    }
}

std::function<void()> read_optimizer_state(const core::Record& in, Optimizer& optimizer,
                                           const std::string& prefix) {
  const Type type = type_of(optimizer);
  if (in.text(prefix + ".type") != type_name(type))
    throw InvalidArgument(str_cat(in.source(), " holds the state of optimizer '",
                                  core::printable(in.text(prefix + ".type")),
                                  "'; this job's train.optimizer.name is '", type_name(type), "'"));
  auto& groups = optimizer.param_groups();
  if (in.integer(prefix + ".groups") != static_cast<int64_t>(groups.size()))
    throw CorruptData(str_cat(in.source(), ": ", prefix, ".groups is ",
                              in.integer(prefix + ".groups"), ", the optimizer has ",
                              groups.size()));
  // Everything is read into these first; the returned action only moves it in.
  auto options = std::make_shared<std::vector<std::unique_ptr<OptimizerOptions>>>();
  auto states =
      std::make_shared<std::vector<std::pair<std::string, std::unique_ptr<OptimizerParamState>>>>();
  size_t k = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto& params = groups[g].params();
    if (in.integer(group_key(prefix, g, "params")) != static_cast<int64_t>(params.size()))
      throw CorruptData(str_cat(in.source(), ": ", group_key(prefix, g, "params"), " is ",
                                in.integer(group_key(prefix, g, "params")), ", the group has ",
                                params.size()));
    const OptimizerOptions& now = groups[g].options();
    options->push_back(
        type == Type::kSgd ? read_options(sgd_fields(), now, g, in, prefix)
        : type == Type::kAdam
            ? read_options(adam_fields<torch::optim::AdamOptions>(), now, g, in, prefix)
            : read_options(adam_fields<torch::optim::AdamWOptions>(), now, g, in, prefix));
    for (const auto& p : params) {
      auto st = type == Type::kSgd ? read_sgd_state(in, k, p, prefix)
                : type == Type::kAdam
                    ? read_adam_state<torch::optim::AdamParamState>(in, k, p, prefix)
                    : read_adam_state<torch::optim::AdamWParamState>(in, k, p, prefix);
      if (st) states->emplace_back(state_id(p), std::move(st));
      ++k;
    }
  }
  return [&optimizer, options, states] {
    auto& groups = optimizer.param_groups();
    for (size_t g = 0; g < groups.size(); ++g) groups[g].set_options(std::move((*options)[g]));
    optimizer.state().clear();
    for (auto& [id, st] : *states) optimizer.state()[id] = std::move(st);
  };
}

// --- Field by field ----------------------------------------------------------------------------

std::string optimizer_type(const Optimizer& optimizer) { return type_name(type_of(optimizer)); }

const std::vector<std::string>& state_fields(const std::string& type) {
  static const std::vector<std::string> sgd = {"momentum_buffer"};
  static const std::vector<std::string> adam = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
  return type == "sgd" ? sgd : adam;
}

namespace {

template <typename O>
std::map<std::string, double> read_named(const std::vector<Field<O>>& fields,
                                         const core::Record& in, size_t g,
                                         const std::string& prefix) {
  std::map<std::string, double> out;
  for (const auto& f : fields) {
    const double v = in.real(group_key(prefix, g, f.name));
    if (!std::isfinite(v))
      throw CorruptData(str_cat(in.source(), ": ", group_key(prefix, g, f.name), " is ", v));
    out[f.name] = v;
  }
  return out;
}

template <typename O>
void set_named(const std::vector<Field<O>>& fields, Optimizer& optimizer,
               const std::map<std::string, double>& values) {
  for (auto& group : optimizer.param_groups()) {
    auto options = group.options().clone();
    for (const auto& f : fields) {
      const auto it = values.find(f.name);
      KRAB_CHECK(it != values.end(), "optimizer option '", f.name, "' not given");
      f.set(static_cast<O&>(*options), it->second);
    }
    group.set_options(std::move(options));
  }
}

template <typename O>
std::map<std::string, double> get_named(const std::vector<Field<O>>& fields,
                                        const OptimizerOptions& options) {
  std::map<std::string, double> out;
  for (const auto& f : fields) out[f.name] = f.get(static_cast<const O&>(options));
  return out;
}

template <typename S>
void install_adam(Optimizer& optimizer, const std::string& id, const ParamStateValues& v) {
  auto st = std::make_unique<S>();
  st->step(*v.step);
  const auto field = [&](const char* name) {
    const auto it = v.fields.find(name);
    return it == v.fields.end() ? at::Tensor() : it->second;
  };
  KRAB_CHECK(field("exp_avg").defined() && field("exp_avg_sq").defined(),
             "an Adam state needs exp_avg and exp_avg_sq");
  st->exp_avg(field("exp_avg"));
  st->exp_avg_sq(field("exp_avg_sq"));
  if (field("max_exp_avg_sq").defined()) st->max_exp_avg_sq(field("max_exp_avg_sq"));
  optimizer.state()[id] = std::move(st);
}

}  // namespace

std::map<std::string, double> read_group_options(const core::Record& in, const std::string& type,
                                                 size_t group, const std::string& prefix) {
  if (type == "sgd") return read_named(sgd_fields(), in, group, prefix);
  if (type == "adam")
    return read_named(adam_fields<torch::optim::AdamOptions>(), in, group, prefix);
  if (type == "adamw")
    return read_named(adam_fields<torch::optim::AdamWOptions>(), in, group, prefix);
  throw CorruptData(str_cat(in.source(), ": ", prefix, ".type '", core::printable(type),
                            "' is not sgd, adam or adamw"));
}

std::map<std::string, double> group_options(const Optimizer& optimizer, size_t group) {
  const OptimizerOptions& o = optimizer.param_groups().at(group).options();
  switch (type_of(optimizer)) {
    case Type::kSgd:
      return get_named(sgd_fields(), o);
    case Type::kAdam:
      return get_named(adam_fields<torch::optim::AdamOptions>(), o);
    case Type::kAdamW:
      return get_named(adam_fields<torch::optim::AdamWOptions>(), o);
  }
  return {};
}

void set_group_options(Optimizer& optimizer, const std::map<std::string, double>& options) {
  switch (type_of(optimizer)) {
    case Type::kSgd:
      return set_named(sgd_fields(), optimizer, options);
    case Type::kAdam:
      return set_named(adam_fields<torch::optim::AdamOptions>(), optimizer, options);
    case Type::kAdamW:
      return set_named(adam_fields<torch::optim::AdamWOptions>(), optimizer, options);
  }
}

namespace {

// Copies `v` into the tensors of a state the parameter already has (one made before training:
// parallel.offload's state lives in a memory-mapped file and must stay there); a field `v`
// lacks is zeroed, a missing step count is 0 (Adam then takes its first step exactly as from
// no state: design §12, check 9). False when there is no such state or a field's size differs.
bool copy_into_existing(Optimizer& optimizer, const std::string& id, Type type,
                        const ParamStateValues& v) {
  const auto it = optimizer.state().find(id);
  if (it == optimizer.state().end()) return false;
  std::vector<std::pair<at::Tensor, const char*>> dst;
  if (type == Type::kSgd) {
    dst.emplace_back(static_cast<torch::optim::SGDParamState&>(*it->second).momentum_buffer(),
                     "momentum_buffer");
  } else {
    auto& st = *it->second;
    const bool w = type == Type::kAdamW;
    auto* a = w ? nullptr : static_cast<torch::optim::AdamParamState*>(&st);
    auto* aw = w ? static_cast<torch::optim::AdamWParamState*>(&st) : nullptr;
    dst.emplace_back(w ? aw->exp_avg() : a->exp_avg(), "exp_avg");
    dst.emplace_back(w ? aw->exp_avg_sq() : a->exp_avg_sq(), "exp_avg_sq");
    dst.emplace_back(w ? aw->max_exp_avg_sq() : a->max_exp_avg_sq(), "max_exp_avg_sq");
  }
  for (const auto& [t, name] : dst) {
    const auto f = v.fields.find(name);
    if (t.defined() && f != v.fields.end() && f->second.defined() && f->second.numel() != t.numel())
      return false;
  }
  at::NoGradGuard no_grad;
  for (const auto& [t, name] : dst) {
    if (!t.defined()) continue;
    const auto f = v.fields.find(name);
    if (f == v.fields.end() || !f->second.defined())
      t.zero_();
    else
      t.copy_(f->second.reshape(t.sizes()));
  }
  if (type == Type::kAdam)
    static_cast<torch::optim::AdamParamState&>(*it->second).step(v.step.value_or(0));
  if (type == Type::kAdamW)
    static_cast<torch::optim::AdamWParamState&>(*it->second).step(v.step.value_or(0));
  return true;
}

}  // namespace

void install_param_state(Optimizer& optimizer, const at::Tensor& param,
                         const ParamStateValues& values) {
  const std::string id = state_id(param);
  if (copy_into_existing(optimizer, id, type_of(optimizer), values)) return;
  optimizer.state().erase(id);
  switch (type_of(optimizer)) {
    case Type::kSgd: {
      const auto it = values.fields.find("momentum_buffer");
      if (it == values.fields.end() || !it->second.defined()) return;
      auto st = std::make_unique<torch::optim::SGDParamState>();
      st->momentum_buffer(it->second);
      optimizer.state()[id] = std::move(st);
      return;
    }
    case Type::kAdam:
      if (values.step) install_adam<torch::optim::AdamParamState>(optimizer, id, values);
      return;
    case Type::kAdamW:
      if (values.step) install_adam<torch::optim::AdamWParamState>(optimizer, id, values);
      return;
  }
}

ParamStateValues param_state_values(const Optimizer& optimizer, const at::Tensor& param) {
  ParamStateValues out;
  const auto it = optimizer.state().find(state_id(param));
  if (it == optimizer.state().end()) return out;
  const auto put = [&out](const char* name, const at::Tensor& t) {
    if (t.defined()) out.fields[name] = t;
  };
  switch (type_of(optimizer)) {
    case Type::kSgd:
      put("momentum_buffer",
          static_cast<const torch::optim::SGDParamState&>(*it->second).momentum_buffer());
      break;
    case Type::kAdam: {
      const auto& st = static_cast<const torch::optim::AdamParamState&>(*it->second);
      out.step = st.step();
      put("exp_avg", st.exp_avg());
      put("exp_avg_sq", st.exp_avg_sq());
      put("max_exp_avg_sq", st.max_exp_avg_sq());
      break;
    }
    case Type::kAdamW: {
      const auto& st = static_cast<const torch::optim::AdamWParamState&>(*it->second);
      out.step = st.step();
      put("exp_avg", st.exp_avg());
      put("exp_avg_sq", st.exp_avg_sq());
      put("max_exp_avg_sq", st.max_exp_avg_sq());
      break;
    }
  }
  return out;
}

}  // namespace krab::train
