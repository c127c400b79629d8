#include "models/model.h"

#include <torch/torch.h>

#include "core/errors.h"
#include "models/builders.h"

namespace krab::models {

at::Tensor Model::loss(const at::Tensor& logits, const at::Tensor& targets) {
  // Flattening makes one rule serve [B, C] and [B, T, V] logits alike.
  return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}),
                                              targets.reshape({-1}));
}

std::pair<int64_t, int64_t> Model::correct(const at::Tensor& logits, const at::Tensor& targets) {
  const at::Tensor hits = logits.argmax(-1).eq(targets);
  return {hits.sum().item<int64_t>(), hits.numel()};
}

void Model::set_unit_runner(UnitRunner* runner, std::vector<int> unit_of_candidate) {
  if (runner != nullptr) {
    const size_t n = unit_candidates().size();
    KRAB_CHECK_ARG(unit_of_candidate.size() == n, "set_unit_runner: ", unit_of_candidate.size(),
                   " unit indices for ", n, " unit candidates");
  }
  runner_ = runner;
  unit_of_candidate_ = runner != nullptr ? std::move(unit_of_candidate) : std::vector<int>{};
}

at::Tensor Model::run_unit(int candidate, const at::Tensor& x, const UnitForward& forward) {
  if (runner_ == nullptr || candidate < 0 ||
      candidate >= static_cast<int>(unit_of_candidate_.size()) || unit_of_candidate_[candidate] < 0)
    return forward(x);
  return runner_->run(unit_of_candidate_[candidate], x, forward);
}

namespace detail {

void announce_units(Model& model, BuildObserver* observer) {
  if (observer == nullptr) return;
  const auto modules = model.named_modules();
  for (const std::string& path : model.unit_candidates()) {
    const auto* found = modules.find(path);
    KRAB_CHECK(found != nullptr, "unit candidate '", path, "' is not a submodule");
    observer->on_unit_built(path, **found);
  }
}

}  // namespace detail

namespace {

std::shared_ptr<Model> build(const ModelSpec& spec, BuildObserver* observer) {
  // A user's module decides for itself what inputs and how many outputs it takes; check_fits
  // (torchscript.h) tries it on the data instead.
  if (spec.name == "torchscript") {
    std::shared_ptr<Model> model = detail::make_torchscript(spec);
    detail::announce_units(*model, observer);  // loaded whole, then announced
    return model;
  }
  detail::check_builtin_spec(spec);
  std::shared_ptr<Model> model;
  if (spec.name == "mlp") model = detail::make_mlp(spec);
  if (spec.name == "cnn") model = detail::make_cnn(spec);
  if (spec.name == "gpt") return detail::make_gpt(spec, observer);  // announces as it builds
  if (model == nullptr)
    throw InvalidArgument(
        str_cat("unknown model '", spec.name, "'; known models: mlp, cnn, gpt, torchscript"));
  detail::announce_units(*model, observer);
  return model;
}

}  // namespace

std::shared_ptr<Model> make_model(const ModelSpec& spec, BuildObserver* observer) {
  std::shared_ptr<Model> model = build(spec, observer);
  if (observer != nullptr) observer->on_unit_built("", *model);
  return model;
}

namespace detail {

void check_builtin_spec(const ModelSpec& spec) {
  KRAB_CHECK_ARG(spec.loss == "cross_entropy", "train.loss '", spec.loss,
                 "' is for model.name torchscript; the built-in models train with cross_entropy");
  KRAB_CHECK_ARG(!spec.input_shape.empty(), "model '", spec.name,
                 "': input shape is empty (set it from the dataset)");
  for (int64_t d : spec.input_shape) {
    KRAB_CHECK_ARG(d >= 1, "model '", spec.name, "': input shape has a dimension of ", d);
  }
  KRAB_CHECK_ARG(spec.num_classes >= 2, "model.num_classes must be >= 2, got ", spec.num_classes);
}

}  // namespace detail

int64_t parameter_count(const torch::nn::Module& module) {
  int64_t n = 0;
  for (const at::Tensor& p : module.parameters()) n += p.numel();
  return n;
}

}  // namespace krab::models
