// The parameter-server worker (sync.mode: async): no collective group. Server 0 hands out data
// tickets (slice ticket % W of global step ticket / W) until the job's W x steps gradients are
// in; the worker computes the gradient of its ticket, pushes it and pulls fresh parameters in
// one call (sync/param_server.h), and the servers apply the updates. A slow worker does fewer
// steps; a dead one takes nothing down with it.
#pragma once

#include <memory>

#include "engine/engine.h"
#include "models/model.h"
#include "sync/param_server.h"

namespace krab::sync {

class PsWorkerEngine : public engine::Engine {
 public:
  // Pulls the initial parameters into `model`.
  PsWorkerEngine(std::shared_ptr<models::Model> model, std::unique_ptr<PsClient> client, int rank,
                 int world_size, int64_t global_micro_batch);

  std::string name() const override { return "async"; }
  models::Model& model() override { return *model_; }
  std::optional<engine::StepPlan> next_step() override;
  void reduce_gradients() override;
  void apply(double lr) override {}  // the servers apply the update
  void keep_alive() override;
  void finish(const engine::RunSummary& summary) override;
  comm::Communicator* group() override { return nullptr; }
  engine::EvaluationMode evaluation_mode() const override {
    return engine::EvaluationMode::kDeferred;
  }
  engine::TrainState state() override { return {model_.get(), nullptr}; }
  nlohmann::json describe() const override;

 private:
  std::shared_ptr<models::Model> model_;
  std::unique_ptr<PsClient> client_;
  int rank_, world_size_;
  int64_t global_micro_batch_;
  std::vector<at::Tensor> params_;
  at::Tensor flat_, grad_;
  PullResult next_;
  int64_t done_ = 0;
};

}  // namespace krab::sync
