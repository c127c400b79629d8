// The engines behind the training loop (engine/engine.h), driven the way train/trainer.cpp
// drives them, on ranks that are threads joined by loopback Gloo: which steps and slices they
// hand out, and when local SGD's replicas agree (the average, against its closed form).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "core/flat.h"
#include "models/model.h"
#include "parallel/dp_engine.h"
#include "support/gloo_ranks.h"
#include "sync/local_sgd.h"

namespace krab {
namespace {

std::shared_ptr<models::Model> small_mlp() {
  models::ModelSpec spec;
  spec.name = "mlp";
  spec.input_shape = {4};
  spec.num_classes = 3;
  spec.hidden = 8;
  return models::make_model(spec);
}

parallel::OptimizerFactory sgd(double lr) {
  return [lr](std::vector<at::Tensor> ps) -> std::unique_ptr<torch::optim::Optimizer> {
    return std::make_unique<torch::optim::SGD>(ps, torch::optim::SGDOptions(lr));
  };
}

// max over ranks of |p - mean over ranks of p|, summed over parameters: 0 iff replicas agree.
double spread(models::Model& model, comm::Communicator& comm) {
  at::Tensor mine = core::flatten(model.parameters());
  at::Tensor mean = mine.clone();
  comm.allreduce(mean, comm::ReduceOp::kAvg)->wait();
  at::Tensor dev = (mine - mean).abs().max().reshape({1});
  comm.allreduce(dev, comm::ReduceOp::kMax)->wait();
  return dev.item<double>();
}

TEST(DataParallelEngine, HandsOutStepsFromTheResumePointAndThisRanksEqualSlice) {
  testing::run_gloo_ranks_owned(3, [](int rank, std::unique_ptr<comm::Communicator> comm) {
    parallel::DataParallelEngineOptions o;
    o.total_steps = 7;
    o.global_micro_batch = 10;
    parallel::DataParallelEngine engine(small_mlp(), std::move(comm), o, nullptr, sgd(0.1));
    engine.start_at(4);
    std::vector<int64_t> steps;
    while (auto plan = engine.next_step()) {
      steps.push_back(plan->step);
      EXPECT_EQ(plan->slice.begin, 10 * rank / 3);
      EXPECT_EQ(plan->slice.end, 10 * (rank + 1) / 3);
    }
    EXPECT_EQ(steps, (std::vector<int64_t>{4, 5, 6}));
    EXPECT_EQ(engine.name(), "sync");
    EXPECT_EQ(engine.describe()["compression"], "allreduce");
  });
}

// A model with buffers: Linear -> BatchNorm1d, whose running statistics each rank updates from
// its own data.
class BatchNormNet : public models::Model {
 public:
  BatchNormNet()
      : fc_(register_module("fc", torch::nn::Linear(4, 3))),
        bn_(register_module("bn", torch::nn::BatchNorm1d(3))) {}
  at::Tensor forward(const at::Tensor& x) override { return bn_->forward(fc_->forward(x)); }

 private:
  torch::nn::Linear fc_;
  torch::nn::BatchNorm1d bn_;
};

// DDP's broadcast_buffers: with it every rank leaves each step with rank 0's buffers; without
// it each rank keeps the statistics of its own data.
TEST(DataParallelEngine, BroadcastsRankZerosBuffersAfterEveryStepWhenAsked) {
  for (bool broadcast : {true, false}) {
    testing::run_gloo_ranks_owned(
        2, [broadcast](int rank, std::unique_ptr<comm::Communicator> comm) {
          torch::manual_seed(3);
          parallel::DataParallelEngineOptions o;
          o.total_steps = 3;
          o.global_micro_batch = 16;
          o.broadcast_buffers = broadcast;
          comm::Communicator* group = comm.get();
          parallel::DataParallelEngine engine(std::make_shared<BatchNormNet>(), std::move(comm), o,
                                              nullptr, sgd(0.1));
          torch::manual_seed(1000 + rank);  // each rank its own data
          auto& model = engine.model();
          model.train();
          while (auto plan = engine.next_step()) {
            engine.before_backward(0, true);
            auto x = torch::randn({8, 4}) * (1 + rank);
            model.loss(model.forward(x), torch::randint(0, 3, {8}, torch::kInt64)).backward();
            engine.reduce_gradients();
            engine.apply(0.1);
            engine.after_step(*plan);
            at::Tensor mine = model.named_buffers()["bn.running_var"].clone();
            at::Tensor rank0 = mine.clone();
            group->broadcast(rank0, 0)->wait();
            EXPECT_EQ(torch::equal(mine, rank0), broadcast || rank == 0)
                << "broadcast " << broadcast << " rank " << rank << " step " << plan->step;
          }
          EXPECT_EQ(model.named_buffers()["bn.num_batches_tracked"].item<int64_t>(), 3);
        });
  }
}

TEST(AverageModel, GivesEveryRankTheMeanOfParametersAndFloatBuffers) {
  testing::run_gloo_ranks_owned(2, [](int rank, std::unique_ptr<comm::Communicator> comm) {
    torch::manual_seed(100 + rank);  // different replicas
    auto model = small_mlp();
    const at::Tensor mine = core::flatten(model->parameters());
    // Every rank learns both replicas by two broadcasts: the expected mean, computed apart.
    at::Tensor from0 = mine.clone(), from1 = mine.clone();
    comm->broadcast(from0, 0)->wait();
    comm->broadcast(from1, 1)->wait();
    sync::average_model(*model, *comm);
    const at::Tensor expected = (from0 + from1) / 2;
    EXPECT_TRUE(torch::allclose(core::flatten(model->parameters()), expected, 1e-6, 1e-7));
  });
}

// warm-up 2, period 3, 10 steps: synchronous steps 1-2, local steps after, averages after
// steps 5 and 8 (every 3 past the warm-up) and 10 (the last) — replicas agree exactly then.
TEST(LocalSgdEngine, ReplicasAgreeAfterWarmupStepsAndEachAverageOnly) {
  testing::run_gloo_ranks_owned(2, [](int rank, std::unique_ptr<comm::Communicator> comm) {
    torch::manual_seed(7);
    parallel::DataParallelEngineOptions o;
    o.total_steps = 10;
    o.global_micro_batch = 8;
    comm::Communicator* group = comm.get();
    sync::LocalSgdEngine engine(small_mlp(), std::move(comm), o, nullptr, sgd(0.5),
                                sync::LocalSgdOptions{3, 2});
    EXPECT_EQ(engine.name(), "local_sgd");
    torch::manual_seed(1000 + rank);  // each rank its own data
    std::vector<int64_t> agreed;
    while (auto plan = engine.next_step()) {
      engine.before_backward(0, true);
      auto& model = engine.model();
      auto x = torch::randn({4, 4});
      auto y = torch::randint(0, 3, {4}, torch::kInt64);
      model.loss(model.forward(x), y).backward();
      engine.reduce_gradients();
      engine.apply(0.5);
      engine.after_step(*plan);
      if (spread(model, *group) == 0) agreed.push_back(plan->step + 1);
    }
    EXPECT_EQ(agreed, (std::vector<int64_t>{1, 2, 5, 8, 10}));
  });
}

}  // namespace
}  // namespace krab
