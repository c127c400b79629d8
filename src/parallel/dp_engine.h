// The data-parallel engine: every rank holds a full replica; DataParallel averages the
// gradients through its comm hook (plain all-reduce or a compressor) during backward, and each
// rank applies the same update with its own optimizer. Steps are handed out in order from the
// resume point; rank r computes slice r of every global micro-batch: W equal slices, or slices
// sized by each rank's speed with parallel.balance: auto (parallel/steps.h).
#pragma once

#include <functional>
#include <memory>

#include "comm/communicator.h"
#include "engine/engine.h"
#include "models/model.h"
#include "parallel/data_parallel.h"
#include "parallel/steps.h"

namespace torch::optim {
class Optimizer;
}

namespace krab::parallel {

using OptimizerFactory =
    std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<at::Tensor>)>;

struct DataParallelEngineOptions {
  int64_t total_steps = 0;
  int64_t global_micro_batch = 0;  // examples of one global micro-batch (the sampler's batch)
  DataParallelOptions data_parallel;
  // After every step, rank 0's buffers go to every rank (DataParallel::broadcast_buffers), so
  // the next forward, an evaluation and the final model see the same buffers on every rank.
  // DDP broadcasts before each forward instead; after the step covers the forwards all the
  // same and also what happens between steps. Local SGD averages buffers with the model.
  bool broadcast_buffers = true;
  // parallel.balance: auto — slices sized by each rank's speed (parallel/steps.h).
  SliceBalance balance;
};

class DataParallelEngine : public engine::Engine {
 public:
  // Broadcasts rank 0's parameters and buffers (DataParallel, unless
  // options.data_parallel.broadcast_initial_state is off), then builds the optimizer — or
  // adopts `adopted` when given: the optimizer of an earlier engine over the same model's
  // parameters (an elastic run's next generation keeps its momentum and moments that way,
  // without a copy).
  DataParallelEngine(std::shared_ptr<models::Model> model, std::unique_ptr<comm::Communicator> comm,
                     DataParallelEngineOptions options, std::unique_ptr<CommHook> hook,
                     const OptimizerFactory& make_optimizer,
                     std::unique_ptr<torch::optim::Optimizer> adopted = nullptr);
  ~DataParallelEngine() override;

  std::string name() const override { return "sync"; }
  models::Model& model() override { return *model_; }
  void start_at(int64_t step) override { steps_.start_at(step); }
  std::optional<engine::StepPlan> next_step() override;
  void before_backward(int64_t micro, bool last) override { dp_.set_sync(last); }
  void after_compute(double seconds) override { steps_.after_compute(seconds); }
  void reduce_gradients() override { dp_.finish(); }
  void apply(double lr) override;
  void after_step(const engine::StepPlan& plan) override;
  comm::Communicator* group() override { return comm_.get(); }
  engine::TrainState state() override { return {model_.get(), optimizer_.get()}; }
  // Each bucket's reduction, launch to wait ("comm.bucket.<b>").
  std::vector<engine::PhaseSpan> step_spans() const override;
  void measure_gradient_norms(bool on) override { dp_.measure_norms(on); }
  std::optional<std::pair<double, double>> gradient_norms() const override;
  // The full replica: parameters, their .grad, the optimizer's state, and DataParallel's bucket
  // buffers (a second copy of every gradient, alive all run) as the working set.
  engine::MemoryStats memory() const override;
  nlohmann::json describe() const override;

  // For an elastic run's change of generation (elastic/elastic_engine.h): the group leaves
  // this engine (Engine::take_group), then the optimizer, which goes to the next generation's
  // engine; the engine must then only be destroyed.
  std::unique_ptr<torch::optim::Optimizer> take_optimizer();
  std::unique_ptr<comm::Communicator> take_group() override;
  // Rank 0's buffers to every rank (a broadcast of an aborted generation may have reached only
  // some). Collective.
  void broadcast_buffers() { dp_.broadcast_buffers(); }

 protected:
  DataParallel& data_parallel() { return dp_; }
  int64_t total_steps() const { return options_.total_steps; }

 private:
  std::shared_ptr<models::Model> model_;
  std::unique_ptr<comm::Communicator> comm_;
  DataParallelEngineOptions options_;
  DataParallel dp_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  DataParallelSteps steps_;
};

}  // namespace krab::parallel
