// parallel/memory_stats.h: storage bytes are counted once per storage (views of one flat buffer,
// as ZeRO's unit storage makes them, count as the buffer), undefined tensors count nothing, and
// the optimizer state tensors are what the closed forms say: Adam 2 per parameter (3 with
// amsgrad), SGD with momentum 1, plain SGD none.
#include "parallel/memory_stats.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace krab::parallel {
namespace {

TEST(MemoryStats, ViewsOfOneStorageCountOnce) {
  const at::Tensor flat = torch::zeros({100});
  const at::Tensor a = flat.narrow(0, 0, 30).view({5, 6});
  const at::Tensor b = flat.narrow(0, 30, 70);
  EXPECT_EQ(storage_bytes({a, b}), 400);
  EXPECT_EQ(storage_bytes({a, b, torch::zeros({3}, torch::kFloat64), at::Tensor()}), 424);
  EXPECT_EQ(storage_bytes({}), 0);
}

int64_t state_bytes_after_a_step(torch::optim::Optimizer& opt, std::vector<at::Tensor>& params) {
  for (at::Tensor& p : params) p.mutable_grad() = torch::ones_like(p);
  opt.step();
  return storage_bytes(optimizer_state_tensors(opt));
}

TEST(MemoryStats, OptimizerStateIsKFloatsPerParameter) {
  auto make = [] {
    return std::vector<at::Tensor>{torch::zeros({7, 3}).requires_grad_(),
                                   torch::zeros({5}).requires_grad_()};
  };
  const int64_t bytes = 4 * 26;
  auto p = make();
  torch::optim::Adam adam(p, torch::optim::AdamOptions(0.1));
  EXPECT_EQ(storage_bytes(optimizer_state_tensors(adam)), 0);  // no state before the first step
  EXPECT_EQ(state_bytes_after_a_step(adam, p), 2 * bytes);
  p = make();
  torch::optim::AdamW amsgrad(p, torch::optim::AdamWOptions(0.1).amsgrad(true));
  EXPECT_EQ(state_bytes_after_a_step(amsgrad, p), 3 * bytes);
  p = make();
  torch::optim::SGD momentum(p, torch::optim::SGDOptions(0.1).momentum(0.9));
  EXPECT_EQ(state_bytes_after_a_step(momentum, p), bytes);
  p = make();
  torch::optim::SGD plain(p, torch::optim::SGDOptions(0.1));
  EXPECT_EQ(state_bytes_after_a_step(plain, p), 0);
  EXPECT_EQ(storage_bytes(gradients(p)), bytes);
}

}  // namespace
}  // namespace krab::parallel
