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
  EXPECT_THROW(resolve_metric(job(""), *linear, values), InvalidArgument);  // float labels
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

// Float labels with a class loss (cross_entropy, nll) are refused naming the data file, the dtype
// and the fix, whatever train.metric says; `auto` reported a test loss for them before (and
// training cast 0.5 to class 0). Integral floats get y.long(), fractional ones the regression
// losses. A module's own training_loss, and mse, take float labels as before.
TEST_F(MetricTest, FloatLabelsWithAClassLossAreRefusedNamingTheFileAndTheFix) {
  const core::Config ce = job("data: {name: tensors, path: train.pt}");
  auto refused = [&](models::Model& model, const core::Config& c, const data::DataSplits& d,
                     std::initializer_list<std::string> parts) {
    try {
      resolve_metric(c, model, d);
      ADD_FAILURE() << "float labels with a class loss were accepted";
    } catch (const InvalidArgument& e) {
      const std::string what = e.what();
      EXPECT_EQ(what.rfind("data.path 'train.pt': y holds Float labels, but ", 0), 0u) << what;
      for (const std::string& part : parts) EXPECT_NE(what.find(part), std::string::npos) << what;
    }
  };
  data::DataSplits whole;
  whole.train = data::TensorDataset(torch::zeros({4, 8}), torch::tensor({0.f, 2.f, 1.f, 2.f}));
  data::DataSplits half = whole;
  half.train.targets = torch::tensor({0.f, 1.f, 0.5f, 2.f});
  models::ModelSpec mlp;
  mlp.name = "mlp";
  mlp.input_shape = {8};
  mlp.num_classes = 3;
  auto builtin = models::make_model(mlp);
  auto net = script(b_.net(8, 4, 3), "net.ts", "cross_entropy");
  for (const char* metric : {"auto", "loss"}) {
    const core::Config c = job(
        std::string("model: {name: mlp}\ndata: {name: tensors, path: train.pt}\ntrain: {metric: ") +
        metric + "}");
    refused(*builtin, c, whole, {"mlp (cross_entropy) takes class indices as integers"});
    refused(*net, c, whole,
            {"train.loss cross_entropy takes class indices as integers", "y.long()"});
    refused(*net, c, half, {"0.5 is not one", "train.loss mse"});
  }
  // A built-in model is refused when its spec is made, before a one-class model is built.
  try {
    model_spec(job("model: {name: mlp}\ndata: {name: tensors, path: train.pt}"), whole);
    ADD_FAILURE() << "a built-in model was specified for float labels";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(
        std::string(e.what()).find("data.path 'train.pt': y holds Float labels, but model.name "
                                   "mlp (cross_entropy) takes class indices as integers; "
                                   "save them as int64: y.long()"),
        std::string::npos)
        << e.what();
  }
  auto nll = script(b_.net(8, 4, 3), "nll.ts", "nll");
  refused(*nll, job("data: {name: tensors, path: train.pt}\ntrain: {loss: nll}"), whole,
          {"nll", "y.long()"});
  // Integer labels stay classes; mse and a module's own loss keep float labels.
  data::DataSplits ints = whole;
  ints.train.targets = torch::tensor({0, 2, 1, 2});
  EXPECT_EQ(resolve_metric(ce, *net, ints), Metric::kAccuracy);
  auto reg = script(b_.linear(8, 1), "reg.ts", "mse");
  EXPECT_EQ(resolve_metric(job("train: {loss: mse}"), *reg, half), Metric::kLoss);
  auto own = script(b_.net(8, 4, 3, R"(
def training_loss(self, x, y):
    return self.forward(x).sum(1).sub(y).pow(2).mean()
)"),
                    "own.ts", "cross_entropy");
  EXPECT_EQ(resolve_metric(ce, *own, half), Metric::kLoss);
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
