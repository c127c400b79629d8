#include "parallel/zero/shard_optimizer.h"

#include <torch/torch.h>

#include "core/errors.h"

namespace krab::parallel::zero {

namespace {

// Adam and AdamW derive from Optimizer directly in LibTorch 1.13, not from each other.
bool element_wise(torch::optim::Optimizer& o) {
  return dynamic_cast<torch::optim::SGD*>(&o) != nullptr ||
         dynamic_cast<torch::optim::Adam*>(&o) != nullptr ||
         dynamic_cast<torch::optim::AdamW*>(&o) != nullptr;
}

std::string state_key(const at::Tensor& t) { return c10::guts::to_string(t.unsafeGetTensorImpl()); }

// Adam and AdamW keep the same fields in two unrelated classes.
template <typename AdamState>
TensorState adam_fields(const AdamState& s) {
  TensorState out{true, s.step(), {s.exp_avg(), s.exp_avg_sq()}};
  if (s.max_exp_avg_sq().defined()) out.fields.push_back(s.max_exp_avg_sq());
  return out;
}

template <typename AdamState>
std::unique_ptr<AdamState> adam_state(const TensorState& t) {
  KRAB_CHECK(t.fields.size() == 2 || t.fields.size() == 3, "Adam state: 2 or 3 fields, got ",
             t.fields.size());
  auto s = std::make_unique<AdamState>();
  s->step(t.step);
  s->exp_avg(t.fields[0]);
  s->exp_avg_sq(t.fields[1]);
  if (t.fields.size() > 2) s->max_exp_avg_sq(t.fields[2]);
  return s;
}

}  // namespace

TensorState get_tensor_state(torch::optim::Optimizer& optimizer, const at::Tensor& param) {
  const auto it = optimizer.state().find(state_key(param));
  if (it == optimizer.state().end()) return {};
  if (auto* adam = dynamic_cast<torch::optim::AdamParamState*>(it->second.get()))
    return adam_fields(*adam);
  if (auto* adamw = dynamic_cast<torch::optim::AdamWParamState*>(it->second.get()))
    return adam_fields(*adamw);
  if (auto* sgd = dynamic_cast<torch::optim::SGDParamState*>(it->second.get()))
    return {true, 0, {sgd->momentum_buffer()}};
  throw Error("get_tensor_state: only sgd, adam and adamw state is known");
}

void set_tensor_state(torch::optim::Optimizer& optimizer, const at::Tensor& param,
                      TensorState state) {
  const std::string key = state_key(param);
  std::unique_ptr<torch::optim::OptimizerParamState> s;
  if (!state.present) {
  } else if (dynamic_cast<torch::optim::Adam*>(&optimizer) != nullptr) {
    s = adam_state<torch::optim::AdamParamState>(state);
  } else if (dynamic_cast<torch::optim::AdamW*>(&optimizer) != nullptr) {
    s = adam_state<torch::optim::AdamWParamState>(state);
  } else if (!state.fields.empty()) {  // SGD with momentum
    auto sgd = std::make_unique<torch::optim::SGDParamState>();
    sgd->momentum_buffer(state.fields[0]);
    s = std::move(sgd);
  }
  if (s)
    optimizer.state()[key] = std::move(s);
  else
    optimizer.state().erase(key);
}

ShardOptimizers::ShardOptimizers(const std::vector<at::Tensor>& shards,
                                 const OptimizerFactory& make_optimizer) {
  for (const auto& shard : shards) {
    auto o = make_optimizer({shard});
    if (!element_wise(*o))
      throw InvalidArgument(
          "train.optimizer.name: parallel.zero_stage > 0 steps each rank's shard alone, which "
          "only sgd, adam and adamw (element-wise updates) can do");
    optimizers_.push_back(std::move(o));
  }
}

ShardOptimizers::~ShardOptimizers() = default;

std::vector<torch::optim::Optimizer*> ShardOptimizers::pointers() const {
  std::vector<torch::optim::Optimizer*> out;
  for (const auto& o : optimizers_) out.push_back(o.get());
  return out;
}

void ShardOptimizers::step(double lr) {
  for (int u = 0; u < size(); ++u) step_unit(u, lr);
}

void ShardOptimizers::step_unit(int unit, double lr) {
  auto& o = *optimizers_.at(unit);
  for (auto& group : o.param_groups()) group.options().set_lr(lr);
  o.step();
}

int64_t ShardOptimizers::state_bytes() const {
  int64_t total = 0;
  for (const auto& o : optimizers_)
    for (const auto& [key, state] : o->state()) {
      if (auto* adam = dynamic_cast<torch::optim::AdamParamState*>(state.get())) {
        total += adam->exp_avg().nbytes() + adam->exp_avg_sq().nbytes();
        if (adam->max_exp_avg_sq().defined()) total += adam->max_exp_avg_sq().nbytes();
      } else if (auto* adamw = dynamic_cast<torch::optim::AdamWParamState*>(state.get())) {
        total += adamw->exp_avg().nbytes() + adamw->exp_avg_sq().nbytes();
        if (adamw->max_exp_avg_sq().defined()) total += adamw->max_exp_avg_sq().nbytes();
      } else if (auto* sgd = dynamic_cast<torch::optim::SGDParamState*>(state.get())) {
        if (sgd->momentum_buffer().defined()) total += sgd->momentum_buffer().nbytes();
      }
    }
  return total;
}

}  // namespace krab::parallel::zero
