#include "sync/ps_worker.h"

#include <torch/torch.h>

#include "core/errors.h"
#include "core/flat.h"

namespace krab::sync {

PsWorkerEngine::PsWorkerEngine(std::shared_ptr<models::Model> model,
                               std::unique_ptr<PsClient> client, int rank, int world_size,
                               int64_t global_micro_batch)
    : model_(std::move(model)),
      client_(std::move(client)),
      rank_(rank),
      world_size_(world_size),
      global_micro_batch_(global_micro_batch),
      params_(model_->parameters()) {
  const int64_t numel = core::total_numel(params_);
  flat_ = torch::zeros({numel});
  grad_ = torch::zeros({numel});
  next_ = client_->pull(flat_);
  core::unflatten_into(flat_, params_);
}

std::optional<engine::StepPlan> PsWorkerEngine::next_step() {
  if (next_.stop) return std::nullopt;
  KRAB_CHECK(next_.ticket >= 0, "parameter server 0 gave no data ticket");
  for (auto& p : params_) p.mutable_grad() = at::Tensor();
  return engine::StepPlan{
      next_.ticket / world_size_,
      data::equal_slice(global_micro_batch_, next_.ticket % world_size_, world_size_)};
}

void PsWorkerEngine::reduce_gradients() {
  core::flatten_into(params_, grad_, /*grads=*/true);
  next_ = client_->push_pull(grad_, flat_);
  ++done_;
  if (!next_.stop) core::unflatten_into(flat_, params_);
}

// "Still here": the servers count out workers silent for sync.worker_timeout_s.
void PsWorkerEngine::keep_alive() { client_->pull(flat_); }

void PsWorkerEngine::finish(const engine::RunSummary& summary) {
  WorkerSummary ws;
  ws.steps = summary.steps;
  ws.seconds = summary.seconds;
  ws.wait_seconds = client_->wait_seconds();
  ws.final_loss = summary.final_loss;
  for (const auto& e : summary.evals)
    ws.evals.push_back({e.step, e.seconds, e.test_accuracy, e.test_loss});
  client_->leave(ws);
}

nlohmann::json PsWorkerEngine::describe() const {
  return {{"rank", rank_},
          {"steps", done_},
          {"bytes_sent", client_->bytes_sent()},
          {"failovers", client_->failovers()}};
}

}  // namespace krab::sync
