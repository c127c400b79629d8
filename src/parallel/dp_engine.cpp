#include "parallel/dp_engine.h"

#include <torch/torch.h>

#include "parallel/auto_compression.h"
#include "parallel/memory_stats.h"

namespace krab::parallel {

DataParallelEngine::DataParallelEngine(std::shared_ptr<models::Model> model,
                                       std::unique_ptr<comm::Communicator> comm,
                                       DataParallelEngineOptions options,
                                       std::unique_ptr<CommHook> hook,
                                       const OptimizerFactory& make_optimizer,
                                       std::unique_ptr<torch::optim::Optimizer> adopted)
    : model_(std::move(model)),
      comm_(std::move(comm)),
      options_(options),
      dp_(*model_, *comm_, options.data_parallel, std::move(hook)),
      optimizer_(adopted ? std::move(adopted) : make_optimizer(model_->parameters())),
      steps_(options.total_steps, options.global_micro_batch, options.balance) {}

DataParallelEngine::~DataParallelEngine() = default;

std::unique_ptr<torch::optim::Optimizer> DataParallelEngine::take_optimizer() {
  return std::move(optimizer_);
}

std::unique_ptr<comm::Communicator> DataParallelEngine::take_group() { return std::move(comm_); }

std::optional<engine::StepPlan> DataParallelEngine::next_step() { return steps_.next(*comm_); }

void DataParallelEngine::apply(double lr) {
  for (auto& group : optimizer_->param_groups()) group.options().set_lr(lr);
  optimizer_->step();
  optimizer_->zero_grad();
}

void DataParallelEngine::after_step(const engine::StepPlan& plan) {
  if (options_.broadcast_buffers) dp_.broadcast_buffers();
}

engine::MemoryStats DataParallelEngine::memory() const {
  engine::MemoryStats m;
  m.known = true;
  const std::vector<at::Tensor> params = model_->parameters();
  m.params = storage_bytes(params);
  m.grads = storage_bytes(gradients(params));
  m.optimizer = storage_bytes(optimizer_state_tensors(*optimizer_));
  // DataParallel allocates one fp32 buffer per bucket at construction and keeps it (the
  // plan's sizes are the buffers' sizes).
  for (int64_t n : dp_.plan().bucket_numel) m.working_set_peak += n * 4;
  return m;
}

std::optional<std::pair<double, double>> DataParallelEngine::gradient_norms() const {
  const DataParallel::GradientNorms& n = dp_.gradient_norms();
  if (!n.valid) return std::nullopt;
  return std::make_pair(n.local_sq, n.global_sq);
}

std::vector<engine::PhaseSpan> DataParallelEngine::step_spans() const {
  std::vector<engine::PhaseSpan> spans;
  const auto& timings = dp_.bucket_timings();
  for (size_t b = 0; b < timings.size(); ++b)
    if (timings[b].done > timings[b].launched)
      spans.push_back(
          {"comm.bucket." + std::to_string(b), timings[b].launched,
           std::chrono::duration<double>(timings[b].done - timings[b].launched).count()});
  return spans;
}

nlohmann::json DataParallelEngine::describe() const {
  nlohmann::json out = {{"backend", comm_->backend()},
                        {"buckets", dp_.plan().buckets.size()},
                        {"compression", dp_.hook().name()}};
  if (const auto* a = dynamic_cast<const AutoCompressionHook*>(&dp_.hook()))
    out["compression_auto"] = a->decisions();
  if (auto balance = steps_.describe(); !balance.is_null()) out["balance"] = balance;
  return out;
}

}  // namespace krab::parallel
