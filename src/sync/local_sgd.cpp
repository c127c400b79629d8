#include "sync/local_sgd.h"

#include <torch/torch.h>

#include "core/flat.h"

namespace krab::sync {

void average_model(torch::nn::Module& model, comm::Communicator& comm) {
  std::vector<at::Tensor> ts = model.parameters();
  for (auto& b : model.buffers())
    if (b.scalar_type() == at::kFloat) ts.push_back(b);
  at::Tensor flat = core::flatten(ts);
  comm.allreduce(flat, comm::ReduceOp::kAvg)->wait();
  core::unflatten_into(flat, ts);
}

LocalSgdEngine::LocalSgdEngine(std::shared_ptr<models::Model> model,
                               std::unique_ptr<comm::Communicator> comm,
                               parallel::DataParallelEngineOptions options,
                               std::unique_ptr<parallel::CommHook> hook,
                               const parallel::OptimizerFactory& make_optimizer,
                               LocalSgdOptions local)
    : DataParallelEngine(std::move(model), std::move(comm), options, std::move(hook),
                         make_optimizer),
      local_(local) {}

std::optional<engine::StepPlan> LocalSgdEngine::next_step() {
  auto plan = DataParallelEngine::next_step();
  local_step_ = plan && plan->step >= local_.warmup_steps;
  return plan;
}

void LocalSgdEngine::before_backward(int64_t micro, bool last) {
  data_parallel().set_sync(!local_step_ && last);
}

void LocalSgdEngine::after_step(const engine::StepPlan& plan) {
  if (!local_step_) return;
  const int64_t done = plan.step + 1;
  if ((done - local_.warmup_steps) % local_.period == 0 || done == total_steps())
    average_model(model(), *group());
}

}  // namespace krab::sync
