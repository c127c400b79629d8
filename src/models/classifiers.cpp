// The image / feature classifiers: mlp and cnn (shapes documented in model.h).
#include <torch/torch.h>

#include "core/errors.h"
#include "models/builders.h"

namespace krab::models::detail {
namespace {

namespace F = torch::nn::functional;

class Mlp : public Model {
 public:
  Mlp(int64_t in, int64_t hidden, int64_t classes)
      : fc1_(register_module("fc1", torch::nn::Linear(in, hidden))),
        fc2_(register_module("fc2", torch::nn::Linear(hidden, hidden))),
        fc3_(register_module("fc3", torch::nn::Linear(hidden, classes))) {}

  at::Tensor forward(const at::Tensor& inputs) override {
    at::Tensor x = inputs.flatten(1);
    x = run_unit(0, x, [this](const at::Tensor& h) { return torch::relu(fc1_->forward(h)); });
    x = run_unit(1, x, [this](const at::Tensor& h) { return torch::relu(fc2_->forward(h)); });
    return run_unit(2, x, [this](const at::Tensor& h) { return fc3_->forward(h); });
  }

  // Each layer with its activation is a unit (a unit owns the ReLU after its Linear).
  std::vector<std::string> unit_candidates() const override { return {"fc1", "fc2", "fc3"}; }

 private:
  torch::nn::Linear fc1_, fc2_, fc3_;
};

class Cnn : public Model {
 public:
  Cnn(int64_t channels, int64_t height, int64_t width, int64_t classes)
      : conv1_(register_module(
            "conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(channels, 32, 3).padding(1)))),
        conv2_(register_module("conv2",
                               torch::nn::Conv2d(torch::nn::Conv2dOptions(32, 64, 3).padding(1)))),
        // Each 2x2 pool floors the spatial size, as PyTorch's MaxPool2d does.
        fc1_(register_module("fc1", torch::nn::Linear(64 * (height / 4) * (width / 4), 128))),
        fc2_(register_module("fc2", torch::nn::Linear(128, classes))) {}

  at::Tensor forward(const at::Tensor& inputs) override {
    // A unit owns what follows its layer up to the next one: ReLU and pooling.
    at::Tensor x = run_unit(0, inputs, [this](const at::Tensor& h) {
      return F::max_pool2d(torch::relu(conv1_->forward(h)), F::MaxPool2dFuncOptions(2));
    });
    x = run_unit(1, x, [this](const at::Tensor& h) {
      return F::max_pool2d(torch::relu(conv2_->forward(h)), F::MaxPool2dFuncOptions(2));
    });
    x = run_unit(2, x.flatten(1),
                 [this](const at::Tensor& h) { return torch::relu(fc1_->forward(h)); });
    return run_unit(3, x, [this](const at::Tensor& h) { return fc2_->forward(h); });
  }

  std::vector<std::string> unit_candidates() const override {
    return {"conv1", "conv2", "fc1", "fc2"};
  }

 private:
  torch::nn::Conv2d conv1_, conv2_;
  torch::nn::Linear fc1_, fc2_;
};

}  // namespace

void check_mlp_spec(const ModelSpec& spec) {
  KRAB_CHECK_ARG(spec.hidden >= 1, "model.hidden must be >= 1, got ", spec.hidden);
}

void check_cnn_spec(const ModelSpec& spec) {
  const auto& s = spec.input_shape;
  KRAB_CHECK_ARG(s.size() == 3 && s[1] >= 4 && s[2] >= 4,
                 "model 'cnn' needs images of shape {channels, height, width} with height and "
                 "width >= 4; the data has shape ",
                 at::IntArrayRef(s), " (use 'mlp' for flat features)");
}

std::shared_ptr<Model> make_mlp(const ModelSpec& spec) {
  check_mlp_spec(spec);
  int64_t in = 1;
  for (int64_t d : spec.input_shape) in *= d;
  return std::make_shared<Mlp>(in, spec.hidden, spec.num_classes);
}

std::shared_ptr<Model> make_cnn(const ModelSpec& spec) {
  check_cnn_spec(spec);
  const auto& s = spec.input_shape;
  return std::make_shared<Cnn>(s[0], s[1], s[2], spec.num_classes);
}

}  // namespace krab::models::detail
