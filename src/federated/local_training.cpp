#include "federated/local_training.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/errors.h"
#include "core/flat.h"
#include "data/sampler.h"
#include "federated/privacy.h"
#include "federated/strategy.h"
#include "train/job.h"

namespace krab::federated {

at::Tensor flatten_parameters(const torch::nn::Module& module) {
  return core::flatten(module.parameters());
}

void load_flat_parameters(torch::nn::Module& module, const at::Tensor& flat) {
  const int64_t expected = models::parameter_count(module);
  KRAB_CHECK_ARG(flat.defined() && flat.dim() == 1 && flat.scalar_type() == at::kFloat,
                 "global parameters must be a 1-D float32 tensor");
  KRAB_CHECK_ARG(flat.numel() == expected, "global parameters have ", flat.numel(),
                 " elements, the model has ", expected);
  core::unflatten_into(flat, module.parameters());
}

LocalTrainer::LocalTrainer(const core::Config& job, const models::ModelSpec& spec)
    : job_(job), model_(models::make_model(spec)) {
  num_parameters_ = models::parameter_count(*model_);
}

LocalResult LocalTrainer::train(const at::Tensor& global, const data::TensorDataset& data,
                                const RoundOptions& options) {
  KRAB_CHECK_ARG(data.size() > 0, "a federated client has no training examples");
  load_flat_parameters(*model_, global);
  model_->train();
  std::vector<at::Tensor> params = model_->parameters();
  std::vector<at::Tensor> start;
  if (options.proximal_mu > 0)
    for (const auto& p : params) start.push_back(p.detach().clone());
  auto optimizer = train::make_optimizer(job_, params);

  const int64_t batch = std::min<int64_t>(job_.get_int("data.batch_size"), data.size());
  data::GlobalBatchSampler sampler(data.size(), batch, options.seed);
  int64_t steps = job_.get_int("federated.local_epochs") * sampler.steps_per_epoch();
  if (job_.get_int("federated.local_steps") > 0) steps = job_.get_int("federated.local_steps");

  double loss_sum = 0;
  for (int64_t s = 0; s < steps; ++s) {
    auto [x, y] = data::gather(data, sampler.indices(s, 0, 1));
    optimizer->zero_grad();
    at::Tensor loss = model_->training_loss(x, y);
    loss.backward();
    // FedProx on the gradients: no second graph through the penalty.
    if (options.proximal_mu > 0) fedprox_add_grad(params, start, options.proximal_mu);
    optimizer->step();
    loss_sum += loss.item<double>();
  }

  LocalResult r;
  r.update = flatten_parameters(*model_) - global;
  r.update_norm = r.update.norm().item<double>();
  if (!std::isfinite(r.update_norm)) {
    // Training diverged. Send an update the server's validation rejects by name ("non-finite
    // values") rather than fail here, which the round would count as a dropout. Every value
    // is NaN: the finite part of a partly diverged update would otherwise leave unclipped and
    // un-noised.
    r.update = at::full_like(r.update, std::numeric_limits<float>::quiet_NaN());
  } else if (options.clip_norm > 0) {
    r.update = clip_to_norm(r.update, options.clip_norm).clipped;
  }
  if (options.local_noise_std > 0 && std::isfinite(r.update_norm))
    r.update = add_gaussian_noise(r.update, options.local_noise_std);
  r.num_examples = data.size();
  r.steps = steps;
  r.mean_loss = steps > 0 ? loss_sum / static_cast<double>(steps) : 0.0;
  return r;
}

double evaluate(models::Model& model, train::Metric metric, const data::TensorDataset& data,
                int64_t examples) {
  if (data.size() == 0) return 0;
  model.eval();
  const double value =
      train::evaluate_range(model, metric, data, 0, train::evaluation_size(data.size(), examples))
          .value();
  model.train();
  return value;
}

RoundRunner::Evaluator held_out_evaluator(models::Model& model, const data::DataSplits& splits,
                                          train::Metric metric, int64_t eval_examples) {
  if (!splits.test || splits.test->size() == 0) return {};
  return [&model, &splits, metric, eval_examples](const at::Tensor& global) {
    load_flat_parameters(model, global);
    return RoundRunner::Score{metric == train::Metric::kLoss,
                              evaluate(model, metric, *splits.test, eval_examples)};
  };
}

}  // namespace krab::federated
