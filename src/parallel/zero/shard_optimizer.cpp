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

}  // namespace

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
