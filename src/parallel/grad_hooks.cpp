#include "parallel/grad_hooks.h"

#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

namespace krab::parallel {

GradReadyHooks::GradReadyHooks(const std::vector<at::Tensor>& params, Callback on_ready)
    : on_ready_(std::move(on_ready)) {
  self_ = std::make_shared<GradReadyHooks*>(this);
  const std::weak_ptr<GradReadyHooks*> weak = self_;
  for (size_t i = 0; i < params.size(); ++i) {
    auto acc = torch::autograd::impl::grad_accumulator(params[i]);
    const auto index = static_cast<int64_t>(i);
    acc->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
        [weak, index](const torch::autograd::variable_list& outputs,
                      const torch::autograd::variable_list&) {
          if (const auto self = weak.lock()) (*self)->on_ready_(index);
          return outputs;
        }));
    accumulators_.push_back(std::move(acc));
  }
}

// Dropping the only strong reference expires every hook's weak one: from here on they are
// no-ops (see the header).
GradReadyHooks::~GradReadyHooks() { self_.reset(); }

}  // namespace krab::parallel
