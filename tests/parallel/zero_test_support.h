// What the ZeRO engine tests share: the small models they train (built under one lock, with
// one seed, so thread-ranks get equal weights) and the optimizers they name.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <mutex>
#include <string>

#include "models/model.h"
#include "parallel/dp_engine.h"

namespace krab::parallel::zero::zero_test {

// "gpt": 2 blocks of width 24 over 29 tokens, context 8; anything else: an mlp of 13 inputs,
// 19 hidden, 5 classes (odd sizes: every unit is padded). Seeded with `seed`; the ranks are
// threads sharing torch's one global generator, hence the lock.
inline std::shared_ptr<models::Model> small_model(const std::string& name, uint64_t seed) {
  static std::mutex init_mu;
  std::lock_guard<std::mutex> lock(init_mu);
  torch::manual_seed(seed);
  models::ModelSpec s;
  s.name = name == "gpt" ? "gpt" : "mlp";
  if (s.name == "gpt") {
    s.input_shape = {8};
    s.num_classes = 29;
    s.layers = 2;
    s.width = 24;
    s.heads = 2;
    s.context = 8;
  } else {
    s.input_shape = {13};
    s.hidden = 19;
    s.num_classes = 5;
  }
  return models::make_model(s);
}

// "sgd" (lr 0.05, momentum 0.9, weight decay 1e-4), "rmsprop" (refused by the engine),
// "amsgrad" (Adam with amsgrad), else Adam (lr 0.01).
inline OptimizerFactory optimizer_of(const std::string& name) {
  return [name](std::vector<at::Tensor> ps) -> std::unique_ptr<torch::optim::Optimizer> {
    if (name == "sgd")
      return std::make_unique<torch::optim::SGD>(
          ps, torch::optim::SGDOptions(0.05).momentum(0.9).weight_decay(1e-4));
    if (name == "rmsprop")
      return std::make_unique<torch::optim::RMSprop>(ps, torch::optim::RMSpropOptions(0.01));
    return std::make_unique<torch::optim::Adam>(
        ps, torch::optim::AdamOptions(0.01).amsgrad(name == "amsgrad"));
  };
}

}  // namespace krab::parallel::zero::zero_test
