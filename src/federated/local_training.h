// The client's half of a federated round: train locally from the global model, return only
// the update.
//
// A client holds its examples (they never leave it) and a model of the job's architecture.
// Each round it receives the global parameters as one flat float32 tensor (strategy.h),
// loads them, runs `federated.local_epochs` passes over its own data with the job's optimizer
// (`train.optimizer.*`, a fresh optimizer state each round, as in FedAvg) and batch size
// (`data.batch_size`, capped at the client's example count), and returns
//
//   update = local parameters - global parameters            (flat float32, model order)
//
// optionally transformed for privacy before it is sent (privacy.h):
//   clip_norm > 0        the update is scaled down to L2 norm <= clip_norm (client-level DP:
//                        every client's influence on the sum is bounded);
//   local_noise_std > 0  Gaussian noise N(0, local_noise_std^2) is added to every coordinate of
//                        the clipped update (local DP: the server never sees a noiseless update).
// With proximal_mu > 0 the local objective carries FedProx's mu/2 ||w - w_global||^2.
//
// Batches: epoch e visits the client's examples in the order of a permutation drawn from
// (seed, e) (data/sampler.h); a last incomplete batch is dropped. `federated.local_steps` > 0
// caps the steps. The same (global, data, options, seed) give the same update bit for bit on
// the same build (CPU).
//
// Thread safety: a LocalTrainer owns a model and is used by one thread at a time; distinct
// trainers are independent. Errors: InvalidArgument when the global tensor does not match the
// model (the message gives both sizes) or the data is empty.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <functional>
#include <memory>

#include "core/config.h"
#include "data/dataset.h"
#include "federated/rounds.h"
#include "models/model.h"
#include "train/job.h"

namespace krab::federated {

// A 1-D float32 copy of every parameter, flattened and concatenated in registration order.
at::Tensor flatten_parameters(const torch::nn::Module& module);

// Copies `flat` (1-D, float32, parameter_count elements) into the module's parameters.
// InvalidArgument naming both sizes when they differ.
void load_flat_parameters(torch::nn::Module& module, const at::Tensor& flat);

struct RoundOptions {
  double proximal_mu = 0;      // FedProx mu; 0 = FedAvg
  double clip_norm = 0;        // > 0: clip the update to this L2 norm
  double local_noise_std = 0;  // > 0: add N(0, std^2) per coordinate after clipping
  uint64_t seed = 0;           // batch order of this client in this round
};

struct LocalResult {
  at::Tensor update;         // 1-D float32, parameter_count elements
  int64_t num_examples = 0;  // examples the client holds (FedAvg's weight)
  int64_t steps = 0;         // optimizer steps taken
  double mean_loss = 0;      // mean training loss over those steps
  double update_norm = 0;    // L2 norm before clipping
};

class LocalTrainer {
 public:
  // Builds the model `spec` describes; reads train.optimizer.*, data.batch_size,
  // federated.local_epochs and federated.local_steps from `job`.
  LocalTrainer(const core::Config& job, const models::ModelSpec& spec);

  LocalResult train(const at::Tensor& global, const data::TensorDataset& data,
                    const RoundOptions& options);

  models::Model& model() { return *model_; }
  int64_t num_parameters() const { return num_parameters_; }

 private:
  core::Config job_;
  std::shared_ptr<models::Model> model_;
  int64_t num_parameters_ = 0;
};

// `metric` of `model` on the first `examples` of `data` (all of them when `examples` is 0 or
// larger: train::evaluation_size) in eval mode: accuracy (correct / total) or the
// example-weighted mean training loss (train/job.h, evaluate_range); 0 for an empty set. Leaves
// it in train mode.
double evaluate(models::Model& model, train::Metric metric, const data::TensorDataset& data,
                int64_t examples = 0);

// A server's evaluator (RoundRunner::Evaluator): loads a flat parameter vector into `model` and
// returns `metric` on the first `eval_examples` of `splits.test` (train.eval_examples; 0: all of
// it); empty (nothing to evaluate) when there is no test data. `model` and `splits` must outlive
// it.
RoundRunner::Evaluator held_out_evaluator(models::Model& model, const data::DataSplits& splits,
                                          train::Metric metric, int64_t eval_examples);

}  // namespace krab::federated
