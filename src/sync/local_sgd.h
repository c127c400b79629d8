// Local SGD (sync.mode: local_sgd): after sync.warmup_steps of plain synchronous steps, each
// rank takes its own optimizer steps without communicating and the models are averaged every
// sync.period steps (and once after the last step, so every rank ends with the same model).
// A data-parallel engine that skips the gradient all-reduce and adds the periodic average.
#pragma once

#include "parallel/dp_engine.h"

namespace krab::sync {

struct LocalSgdOptions {
  int64_t period = 1;        // steps between model averages
  int64_t warmup_steps = 0;  // plain synchronous steps first
};

// Every floating parameter and float buffer of `model` replaced by its average over the
// group, in one all-reduce.
void average_model(torch::nn::Module& model, comm::Communicator& comm);

class LocalSgdEngine : public parallel::DataParallelEngine {
 public:
  LocalSgdEngine(std::shared_ptr<models::Model> model, std::unique_ptr<comm::Communicator> comm,
                 parallel::DataParallelEngineOptions options,
                 std::unique_ptr<parallel::CommHook> hook,
                 const parallel::OptimizerFactory& make_optimizer, LocalSgdOptions local);

  std::string name() const override { return "local_sgd"; }
  std::optional<engine::StepPlan> next_step() override;
  void before_backward(int64_t micro, bool last) override;
  void after_step(const engine::StepPlan& plan) override;

 private:
  LocalSgdOptions local_;
  bool local_step_ = false;  // the current step skips the gradient all-reduce
};

}  // namespace krab::sync
