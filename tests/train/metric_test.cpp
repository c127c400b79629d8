// train/job.h's evaluation metric: what `auto` resolves to, what is refused, and the test loss
// as the example-weighted mean, computed here in closed form.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <filesystem>

#include "core/errors.h"
#include "support/script_modules.h"
#include "train/job.h"

namespace krab::train {
namespace {

namespace fs = std::filesystem;

class MetricTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("krab-metric-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A scripted module saved to `name`, loaded as the job's model with train.loss `loss`.
  std::shared_ptr<models::Model> script(const torch::jit::Module& m, const std::string& name,
                                        const std::string& loss) {
    const std::string path = (dir_ / name).string();
    m.save(path);
    models::ModelSpec spec;
    spec.name = "torchscript";
    spec.path = path;
    spec.loss = loss;
    return models::make_model(spec);
  }
  static core::Config job(const std::string& yaml) { return core::Config::parse(yaml, "job"); }
  static data::DataSplits with_test(at::Tensor y) {
    data::DataSplits d;
    d.test = data::TensorDataset(torch::zeros({y.size(0), 8}), y);
    return d;
  }

  fs::path dir_;
  test::ScriptBuilder b_;
};

TEST_F(MetricTest, AutoIsAccuracyForClassesAndLossForValues) {
  const auto classes = with_test(torch::tensor({0, 1, 2}));
  const auto values = with_test(torch::tensor({0.5f, 1.f, 2.f}));
  models::ModelSpec mlp;
  mlp.name = "mlp";
  mlp.input_shape = {8};
  mlp.num_classes = 3;
  auto builtin = models::make_model(mlp);
  EXPECT_EQ(resolve_metric(job(""), *builtin, classes), Metric::kAccuracy);
  EXPECT_EQ(resolve_metric(job("train: {metric: loss}"), *builtin, classes), Metric::kLoss);

  auto linear = script(b_.net(8, 4, 3), "net.ts", "cross_entropy");
  EXPECT_EQ(resolve_metric(job(""), *linear, classes), Metric::kAccuracy);
  EXPECT_EQ(resolve_metric(job(""), *linear, values), Metric::kLoss);  // float labels
  auto reg = script(b_.linear(8, 1), "reg.ts", "mse");
  EXPECT_EQ(resolve_metric(job("train: {loss: mse}"), *reg, values), Metric::kLoss);
  EXPECT_EQ(resolve_metric(job("train: {loss: bce_with_logits}"), *reg, values), Metric::kLoss);

  // A module's own training_loss may be anything: loss, unless a predict says it classifies.
  const std::string own = R"(
def training_loss(self, x, y):
    return self.forward(x).pow(2).mean()
)";
  auto own_loss = script(b_.net(8, 4, 3, own), "own.ts", "cross_entropy");
  EXPECT_EQ(resolve_metric(job(""), *own_loss, classes), Metric::kLoss);
  auto classifier = script(b_.net(8, 4, 3, own + R"(
def predict(self, x):
    return self.forward(x)
)"),
                           "cls.ts", "cross_entropy");
  EXPECT_EQ(resolve_metric(job(""), *classifier, classes), Metric::kAccuracy);
  EXPECT_STREQ(metric_name(Metric::kLoss), "loss");
  EXPECT_EQ(metric_key(Metric::kAccuracy), "test_accuracy");
}

TEST_F(MetricTest, AccuracyWithoutClassesIsRefusedNamingTheKey) {
  auto reg = script(b_.linear(8, 1), "reg.ts", "mse");
  const auto values = with_test(torch::tensor({0.5f, 1.f}));
  try {
    resolve_metric(job("train: {loss: mse, metric: accuracy}"), *reg, values);
    FAIL() << "accuracy with mse was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("train.metric: accuracy needs class labels, but "
                                         "train.loss mse"),
              std::string::npos)
        << e.what();
  }
  auto net = script(b_.net(8, 4, 3), "net.ts", "cross_entropy");
  try {
    resolve_metric(job("train: {metric: accuracy}"), *net, values);
    FAIL() << "accuracy with float labels was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("train.metric: accuracy needs class labels, but the "
                                         "test labels are Float"),
              std::string::npos)
        << e.what();
  }
}

// 600 examples evaluate in batches of 512 and 88; the last 88 have labels far off, so the mean
// of the two batch means is far from the example-weighted mean the metric must be.
TEST_F(MetricTest, TestLossIsTheExampleWeightedMeanOverTheBatches) {
  torch::manual_seed(3);
  auto model = script(b_.linear(8, 1), "reg.ts", "mse");
  const at::Tensor x = torch::randn({600, 8});
  at::Tensor y = torch::randn({600});
  y.narrow(0, 512, 88).add_(5.0);
  const data::TensorDataset test(x, y);
  model->eval();
  const auto p = model->named_parameters();
  const at::Tensor w = p["weight"].detach().to(torch::kDouble),
                   b = p["bias"].detach().to(torch::kDouble);
  const at::Tensor err = (x.to(torch::kDouble).matmul(w.t()) + b).squeeze(1) - y.to(torch::kDouble);
  const double expected = err.pow(2).mean().item<double>();
  const double batch_means =
      (err.narrow(0, 0, 512).pow(2).mean() + err.narrow(0, 512, 88).pow(2).mean()).item<double>() /
      2;
  ASSERT_GT(std::abs(batch_means - expected), 0.1 * expected);  // the check can tell them apart

  const EvalSums all = evaluate_range(*model, Metric::kLoss, test, 0, 600);
  EXPECT_NEAR(all.value(), expected, 1e-5 * expected);
  EXPECT_EQ(all.count, 600);
  // Two ranks' halves add up to the whole.
  const EvalSums lo = evaluate_range(*model, Metric::kLoss, test, 0, 300);
  const EvalSums hi = evaluate_range(*model, Metric::kLoss, test, 300, 600);
  const EvalSums both{lo.sum + hi.sum, lo.count + hi.count};
  EXPECT_NEAR(both.value(), expected, 1e-5 * expected);
}

TEST_F(MetricTest, AccuracyCountsArgmaxHits) {
  auto net = script(b_.net(8, 4, 3), "net.ts", "cross_entropy");
  net->eval();
  const at::Tensor x = torch::randn({40, 8});
  const at::Tensor y = torch::randint(0, 3, {40});
  torch::NoGradGuard no_grad;
  const int64_t hits = net->forward(x).argmax(1).eq(y).sum().item<int64_t>();
  const EvalSums s = evaluate_range(*net, Metric::kAccuracy, data::TensorDataset(x, y), 0, 40);
  EXPECT_EQ(s.sum, hits);
  EXPECT_EQ(s.count, 40);
}

}  // namespace
}  // namespace krab::train
