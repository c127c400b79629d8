// models::TorchScriptModel: Python names, shared tensors, modes, losses, user methods, refusals.
#include "models/torchscript.h"

#include <gtest/gtest.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>

#include "core/errors.h"
#include "support/script_modules.h"

namespace krab::models {
namespace {

namespace fs = std::filesystem;

class TorchScript : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("krab-ts-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Saves `m` and loads it as a krab model.
  std::shared_ptr<TorchScriptModel> load(const torch::jit::Module& m, ModelSpec spec = {}) {
    const std::string path = (dir_ / "net.ts").string();
    m.save(path);
    spec.name = "torchscript";
    spec.path = path;
    spec.input_shape = {6};
    return std::dynamic_pointer_cast<TorchScriptModel>(make_model(spec));
  }

  void expect_refused(const std::function<void()>& f, std::vector<std::string> needles) {
    try {
      f();
      FAIL() << "no InvalidArgument";
    } catch (const InvalidArgument& e) {
      for (const auto& n : needles)
        EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what() << " / " << n;
    }
  }

  fs::path dir_;
  test::ScriptBuilder b_;
};

std::vector<std::string> keys(const torch::OrderedDict<std::string, at::Tensor>& d) {
  return d.keys();
}

TEST_F(TorchScript, KeepsPythonNamesInPythonOrder) {
  auto m = load(b_.net(6, 8, 3));
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(keys(m->named_parameters()),
            (std::vector<std::string>{"body.fc.weight", "body.fc.bias", "bn.weight", "bn.bias",
                                      "head.weight", "head.bias"}));
  EXPECT_EQ(keys(m->named_buffers()), (std::vector<std::string>{"bn.running_mean", "bn.running_var",
                                                                "bn.num_batches_tracked"}));
}

// The optimizer updates the mirror's tensors; the scripted forward must see the update, and
// its gradients must land on the mirror's tensors.
TEST_F(TorchScript, SharesTensorsWithTheScriptedModule) {
  auto m = load(b_.net(6, 8, 3));
  m->train();
  const at::Tensor x = torch::randn({16, 6});
  const at::Tensor y = torch::randint(0, 3, {16});
  m->training_loss(x, y).backward();
  for (const auto& p : m->named_parameters())
    ASSERT_TRUE(p.value().grad().defined()) << p.key() << " got no gradient";
  m->eval();
  const at::Tensor before = m->forward(x).detach().clone();
  torch::optim::SGD opt(m->parameters(), torch::optim::SGDOptions(0.5));
  opt.step();
  EXPECT_FALSE(torch::allclose(m->forward(x), before)) << "the step did not reach the module";
  {
    torch::NoGradGuard g;
    m->named_parameters()["head.bias"].fill_(100);
  }
  EXPECT_TRUE(torch::allclose(m->forward(x).min(), torch::tensor(100.f), 0, 50));
}

// Training runs the scripted ops with eager autograd, as the Python module runs in eager mode,
// on every call: also after the graph executor's profiling run, whose optimised plan would put
// autodiff subgraphs (relu + max_pool2d here, as in a CNN; slower on CPU) in their place. The
// expectation is the same network written with eager LibTorch ops on copies of the tensors.
TEST_F(TorchScript, GradientsAreEagerAutogradsOnEveryCall) {
  namespace F = torch::nn::functional;
  torch::jit::Module net = b_.module("ConvNet");
  net.register_parameter("weight", torch::randn({4, 1, 3, 3}).requires_grad_(true), false);
  net.register_parameter("bias", torch::randn({4}).requires_grad_(true), false);
  net.register_module("fc", b_.linear(36, 3));
  net.define(R"(
def forward(self, x):
    x = torch.conv2d(x, self.weight, self.bias, [1, 1], [1, 1])
    return self.fc.forward(torch.max_pool2d(torch.relu(x), [2, 2]).flatten(1))
)");
  auto m = load(net);
  m->train();
  const auto params = m->named_parameters();
  for (int call = 0; call < 4; ++call) {
    const at::Tensor x = torch::randn({16, 1, 6, 6});
    const at::Tensor y = torch::randint(0, 3, {16});
    m->zero_grad();
    const at::Tensor loss = m->training_loss(x, y);
    std::ostringstream plan;  // what forward ran: no autodiff subgraph
    plan << *torch::jit::lastExecutedOptimizedGraph();
    EXPECT_EQ(plan.str().find("DifferentiableGraph"), std::string::npos)
        << "call " << call << " ran:\n"
        << plan.str();
    loss.backward();
    std::map<std::string, at::Tensor> eager;
    for (const auto& p : params) eager[p.key()] = p.value().detach().clone().requires_grad_(true);
    at::Tensor h = torch::conv2d(x, eager["weight"], eager["bias"], 1, 1);
    h = torch::max_pool2d(torch::relu(h), 2).flatten(1);
    F::cross_entropy(torch::linear(h, eager["fc.weight"], eager["fc.bias"]), y).backward();
    for (const auto& p : params)
      EXPECT_TRUE(torch::equal(p.value().grad(), eager[p.key()].grad()))
          << "call " << call << ": " << p.key() << "'s gradient differs from eager autograd's";
  }
}

TEST_F(TorchScript, TrainAndEvalReachBatchNorm) {
  auto m = load(b_.net(6, 8, 3));
  const at::Tensor x = torch::randn({32, 6}) * 3 + 1;
  at::Tensor mean = m->named_buffers()["bn.running_mean"];
  m->eval();
  m->forward(x);
  EXPECT_EQ(mean.abs().sum().item<double>(), 0) << "eval mode updated the running mean";
  m->train();
  m->forward(x);
  EXPECT_GT(mean.abs().sum().item<double>(), 0) << "train mode did not update the running mean";
  EXPECT_EQ(m->named_buffers()["bn.num_batches_tracked"].item<int64_t>(), 1);
}

TEST_F(TorchScript, FrozenBatchNormStaysInEvalWhileTraining) {
  ModelSpec spec;
  spec.freeze_batchnorm = true;
  auto m = load(b_.net(6, 8, 3), spec);
  m->train();
  m->forward(torch::randn({32, 6}) * 3 + 1);
  EXPECT_EQ(m->named_buffers()["bn.running_mean"].abs().sum().item<double>(), 0);
  // Each example's output is then independent of its batch: the determinism condition.
  const at::Tensor x = torch::randn({8, 6});
  EXPECT_TRUE(
      torch::allclose(m->forward(x).narrow(0, 0, 4), m->forward(x.narrow(0, 0, 4)), 1e-5, 1e-6));
}

TEST_F(TorchScript, LossesAndTheirShapes) {
  const at::Tensor x = torch::randn({4, 6});
  for (const char* loss : {"cross_entropy", "nll"}) {
    ModelSpec spec;
    spec.loss = loss;
    auto m = load(b_.net(6, 8, 3), spec);
    const at::Tensor y = torch::tensor({0, 2, 1, 2});
    EXPECT_TRUE(std::isfinite(m->training_loss(x, y).item<double>())) << loss;
    expect_refused(
        [&] {
          m->loss(torch::zeros({4, 3, 2}), y);
        },
        {"model.path", "[4, 3, 2]", "[4]", loss});
  }
  for (const char* loss : {"mse", "bce_with_logits"}) {
    ModelSpec spec;
    spec.loss = loss;
    auto one = load(b_.net(6, 8, 1), spec);  // [B, 1] outputs against [B] labels
    EXPECT_TRUE(std::isfinite(one->training_loss(x, torch::tensor({0, 1, 1, 0})).item<double>()));
    auto m = load(b_.net(6, 8, 3), spec);
    expect_refused(
        [&] {
          m->training_loss(x, torch::tensor({0, 1, 1, 0}));
        },
        {"model.path", "[4, 3]", "[4]", loss});
  }
  ModelSpec bad;
  bad.loss = "hinge";
  expect_refused([&] { load(b_.net(6, 8, 3), bad); }, {"train.loss", "hinge"});
}

TEST_F(TorchScript, UsesTheModulesTrainingLossAndPredict) {
  auto m = load(b_.net(6, 8, 3, R"(
def training_loss(self, x, y):
    return (self.forward(x) * 0.0).sum() + 42.0

def predict(self, x):
    return -self.forward(x)
)"));
  ASSERT_TRUE(m->has_training_loss());
  const at::Tensor x = torch::randn({4, 6});
  EXPECT_DOUBLE_EQ(m->training_loss(x, torch::tensor({0, 1, 2, 0})).item<double>(), 42.0);
  m->eval();
  EXPECT_TRUE(torch::equal(m->predict(x), -m->forward(x)));
}

TEST_F(TorchScript, ChecksTheFirstBatchAndTheLabels) {
  auto m = load(b_.net(6, 8, 3));
  const at::Tensor x = torch::randn({2, 6});
  m->check_fits(x, torch::tensor({0, 2}), torch::tensor({0, 1, 2, 2}));
  expect_refused(
      [&] {
        m->check_fits(x, torch::tensor({0, 2}), torch::tensor({0, 1, 9}));
      },
      {"model.path", "3 classes", "0 to 9"});
  expect_refused(
      [&] {
        m->check_fits(x, torch::tensor({{0, 2}, {1, 1}}), torch::tensor({0}));
      },
      {"model.path", "[2, 3]", "[2, 2]"});
  EXPECT_EQ(m->named_buffers()["bn.num_batches_tracked"].item<int64_t>(), 0)
      << "the check moved BatchNorm's statistics";
}

TEST_F(TorchScript, RefusesFilesItCannotTrain) {
  const std::string junk = (dir_ / "junk.ts").string();
  std::ofstream(junk) << "this is not a zip archive";
  ModelSpec spec;
  spec.name = "torchscript";
  spec.path = junk;
  expect_refused([&] { make_model(spec); }, {"model.path", junk, "not a TorchScript module"});
  spec.path = (dir_ / "missing.ts").string();
  expect_refused([&] { make_model(spec); }, {"model.path", "missing.ts"});
  expect_refused([&] { load(b_.frozen(6, 3)); }, {"model.path", "no trainable parameters"});
  ModelSpec builtin;
  builtin.name = "mlp";
  builtin.input_shape = {6};
  builtin.loss = "mse";
  expect_refused([&] { make_model(builtin); }, {"train.loss", "torchscript"});
}

// model.ts: the trained weights, in eval mode, loadable as TorchScript again.
TEST_F(TorchScript, SavesTheTrainedModule) {
  auto m = load(b_.net(6, 8, 3));
  {
    torch::NoGradGuard g;
    for (auto& p : m->parameters()) p.add_(0.25);
    m->named_buffers()["bn.running_mean"].fill_(0.5);
  }
  m->train();
  const std::string out = (dir_ / "model.ts").string();
  m->save(out);
  EXPECT_TRUE(m->is_training()) << "saving switched the training module's mode";
  torch::jit::Module back = torch::jit::load(out);
  EXPECT_FALSE(back.is_training());
  m->eval();
  const at::Tensor x = torch::randn({5, 6});
  EXPECT_TRUE(torch::allclose(back.forward({x}).toTensor(), m->forward(x)));
  ModelSpec spec;
  spec.name = "torchscript";
  spec.path = out;
  auto again = make_model(spec);
  EXPECT_EQ(keys(again->named_parameters()), keys(m->named_parameters()));
}

}  // namespace
}  // namespace krab::models
