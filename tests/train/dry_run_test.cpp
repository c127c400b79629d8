// train/dry_run.h's promise that the launcher's (and fl-sim's) forward and backward on the first
// examples changes nothing a run depends on: with a module whose forward draws random numbers
// (dropout) and moves buffers (BatchNorm in train mode), the parameters' gradients, the buffers,
// the train/eval mode and LibTorch's default generator are what they were.
#include "train/dry_run.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <filesystem>

#include "support/script_modules.h"

namespace krab::train {
namespace {

namespace fs = std::filesystem;

at::Tensor generator_state() {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

class DryRunTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("krab-dry-run-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    // fc Linear(8, 16) -> bn BatchNorm1d -> relu -> dropout(0.5) -> head Linear(16, 4).
    torch::jit::Module root = b_.module("Noisy");
    root.register_module("fc", b_.linear(8, 16));
    root.register_module("bn", b_.batchnorm(16));
    root.register_module("head", b_.linear(16, 4));
    root.define(R"(
def forward(self, x):
    h = torch.relu(self.bn.forward(self.fc.forward(x)))
    return self.head.forward(torch.dropout(h, 0.5, self.training))
)");
    const std::string path = (dir_ / "noisy.pt").string();
    root.save(path);
    models::ModelSpec spec;
    spec.name = "torchscript";
    spec.path = path;
    model_ = models::make_model(spec);
    d_.train = data::TensorDataset(torch::randn({16, 8}), torch::randint(0, 4, {16}));
    d_.input_shape = {8};
    d_.num_classes = 4;
  }
  void TearDown() override { fs::remove_all(dir_); }

  core::Config job() const {
    return core::Config::parse("model: {name: torchscript, path: " + (dir_ / "noisy.pt").string() +
                                   "}\ndata: {name: tensors, path: train.pt}\n",
                               "job");
  }
  // Every buffer, copied.
  std::vector<at::Tensor> buffers() const {
    std::vector<at::Tensor> out;
    for (const at::Tensor& b : model_->buffers()) out.push_back(b.clone());
    return out;
  }
  void expect_unchanged(const std::vector<at::Tensor>& before) const {
    const std::vector<at::Tensor> after = buffers();
    ASSERT_EQ(after.size(), before.size());
    for (size_t i = 0; i < after.size(); ++i) EXPECT_TRUE(torch::equal(after[i], before[i])) << i;
    for (const at::Tensor& p : model_->parameters()) EXPECT_FALSE(p.grad().defined());
  }

  fs::path dir_;
  test::ScriptBuilder b_;
  std::shared_ptr<models::Model> model_;
  data::DataSplits d_;
};

// What the guard puts back does change in a step: a forward in train mode draws from the default
// generator and counts a BatchNorm batch, the backward fills gradients. (Without this the test
// below would prove nothing.)
TEST_F(DryRunTest, AStepChangesTheGeneratorBuffersAndGradients) {
  const at::Tensor rng = generator_state();
  const std::vector<at::Tensor> before = buffers();
  model_->train();
  model_->training_loss(d_.train.inputs.narrow(0, 0, 2), d_.train.targets.narrow(0, 0, 2))
      .backward();
  EXPECT_FALSE(torch::equal(generator_state(), rng));
  EXPECT_FALSE(torch::equal(buffers().back(), before.back()));  // num_batches_tracked
  EXPECT_TRUE(model_->parameters().front().grad().defined());
}

TEST_F(DryRunTest, ChangesNothingInEvalMode) {
  model_->eval();
  const at::Tensor rng = generator_state();
  const std::vector<at::Tensor> before = buffers();
  dry_run(*model_, d_, job());
  EXPECT_TRUE(torch::equal(generator_state(), rng));
  expect_unchanged(before);
  EXPECT_FALSE(model_->is_training());
}

TEST_F(DryRunTest, ChangesNothingInTrainModeAndTheNextDrawsAreTheSame) {
  model_->train();
  torch::manual_seed(7);
  const at::Tensor expected = torch::rand({8});  // the draws of a run without the dry run
  torch::manual_seed(7);
  const std::vector<at::Tensor> before = buffers();
  dry_run(*model_, d_, job());
  EXPECT_TRUE(torch::equal(torch::rand({8}), expected));
  expect_unchanged(before);
  EXPECT_TRUE(model_->is_training());
}

}  // namespace
}  // namespace krab::train
