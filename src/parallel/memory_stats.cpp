#include "parallel/memory_stats.h"

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <unordered_set>

namespace krab::parallel {

int64_t storage_bytes(const std::vector<at::Tensor>& tensors) {
  std::unordered_set<const c10::StorageImpl*> seen;
  int64_t bytes = 0;
  for (const at::Tensor& t : tensors) {
    if (!t.defined() || !t.has_storage()) continue;
    const c10::StorageImpl* impl = t.storage().unsafeGetStorageImpl();
    if (seen.insert(impl).second) bytes += static_cast<int64_t>(impl->nbytes());
  }
  return bytes;
}

std::vector<at::Tensor> optimizer_state_tensors(torch::optim::Optimizer& optimizer) {
  std::vector<at::Tensor> out;
  // LibTorch keys the state by the parameter's TensorImpl address; walking the parameters
  // keeps a deterministic order.
  auto& states = optimizer.state();
  for (const auto& group : optimizer.param_groups()) {
    for (const at::Tensor& p : group.params()) {
      auto it = states.find(c10::guts::to_string(p.unsafeGetTensorImpl()));
      if (it == states.end()) continue;
      torch::optim::OptimizerParamState* s = it->second.get();
      if (auto* adam = dynamic_cast<torch::optim::AdamParamState*>(s)) {
        out.insert(out.end(), {adam->exp_avg(), adam->exp_avg_sq(), adam->max_exp_avg_sq()});
      } else if (auto* adamw = dynamic_cast<torch::optim::AdamWParamState*>(s)) {
        out.insert(out.end(), {adamw->exp_avg(), adamw->exp_avg_sq(), adamw->max_exp_avg_sq()});
      } else if (auto* sgd = dynamic_cast<torch::optim::SGDParamState*>(s)) {
        out.push_back(sgd->momentum_buffer());
      }
    }
  }
  return out;
}

std::vector<at::Tensor> gradients(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> out;
  for (const at::Tensor& p : params)
    if (p.grad().defined()) out.push_back(p.grad());
  return out;
}

}  // namespace krab::parallel
