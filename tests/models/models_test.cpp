// The model zoo: shapes, parameter names and counts, factory errors, GPT causality, and that
// an MLP actually learns.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <set>

#include "core/errors.h"
#include "data/dataset.h"
#include "data/sampler.h"
#include "models/model.h"

namespace krab::models {
namespace {

std::set<std::string> parameter_names(const torch::nn::Module& m) {
  std::set<std::string> names;
  for (const auto& item : m.named_parameters()) names.insert(item.key());
  return names;
}

template <typename E>
void expect_throw_containing(const std::function<void()>& fn,
                             std::initializer_list<std::string> parts) {
  try {
    fn();
  } catch (const E& e) {
    for (const std::string& part : parts) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos)
          << "message '" << e.what() << "' lacks '" << part << "'";
    }
    return;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type: " << e.what();
    return;
  }
  ADD_FAILURE() << "did not throw";
}

ModelSpec gpt_spec() {
  ModelSpec s;
  s.name = "gpt";
  s.input_shape = {16};
  s.num_classes = 256;
  s.layers = 2;
  s.width = 32;
  s.heads = 4;
  s.context = 16;
  return s;
}

class ModelsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    torch::set_num_threads(1);
    torch::manual_seed(0);
  }
};

// ---- shapes and names ----------------------------------------------------------------------

TEST_F(ModelsTest, MlpShapesAndNames) {
  auto m = make_model({"mlp", {1, 28, 28}, 10, 64});
  EXPECT_EQ(m->forward(torch::randn({5, 1, 28, 28})).sizes(), (std::vector<int64_t>{5, 10}));
  EXPECT_EQ(parameter_names(*m), (std::set<std::string>{"fc1.weight", "fc1.bias", "fc2.weight",
                                                        "fc2.bias", "fc3.weight", "fc3.bias"}));
  EXPECT_EQ(parameter_count(*m), 784 * 64 + 64 + 64 * 64 + 64 + 64 * 10 + 10);
}

TEST_F(ModelsTest, CnnShapesNamesAndCount) {
  auto m = make_model({"cnn", {1, 28, 28}, 10});
  EXPECT_EQ(m->forward(torch::randn({3, 1, 28, 28})).sizes(), (std::vector<int64_t>{3, 10}));
  EXPECT_EQ(parameter_names(*m),
            (std::set<std::string>{"conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias",
                                   "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}));
  EXPECT_EQ(m->named_parameters()["conv1.weight"].sizes(), (std::vector<int64_t>{32, 1, 3, 3}));
  EXPECT_EQ(m->named_parameters()["fc1.weight"].sizes(), (std::vector<int64_t>{128, 3136}));
  // Closed form: conv (out*in*3*3 + out) x2, linear (out*in + out) x2.
  auto cnn_params = [](int64_t c, int64_t h, int64_t w, int64_t classes) {
    const int64_t flat = 64 * (h / 4) * (w / 4);
    return (32 * c * 9 + 32) + (64 * 32 * 9 + 64) + (128 * flat + 128) + (classes * 128 + classes);
  };
  EXPECT_EQ(parameter_count(*m), cnn_params(1, 28, 28, 10));
  EXPECT_EQ(parameter_count(*m), 421642);  // PyTorch's count for the same network
}

TEST_F(ModelsTest, CnnTakesOtherImageSizes) {
  auto m = make_model({"cnn", {3, 30, 17}, 7});
  EXPECT_EQ(m->forward(torch::randn({2, 3, 30, 17})).sizes(), (std::vector<int64_t>{2, 7}));
  EXPECT_EQ(m->named_parameters()["fc1.weight"].size(1), 64 * 7 * 4);
}

TEST_F(ModelsTest, GptShapesAndNames) {
  auto m = make_model(gpt_spec());
  const at::Tensor tokens = torch::randint(0, 256, {3, 16}, torch::kInt64);
  EXPECT_EQ(m->forward(tokens).sizes(), (std::vector<int64_t>{3, 16, 256}));
  // Shorter sequences are fine.
  EXPECT_EQ(m->forward(tokens.narrow(1, 0, 5)).sizes(), (std::vector<int64_t>{3, 5, 256}));
  const std::set<std::string> names = parameter_names(*m);
  for (const char* n :
       {"tok_emb.weight", "pos_emb.weight", "blocks.0.ln1.weight", "blocks.0.ln1.bias",
        "blocks.0.attn.qkv.weight", "blocks.0.attn.qkv.bias", "blocks.0.attn.proj.weight",
        "blocks.0.ln2.weight", "blocks.0.mlp.fc.weight", "blocks.0.mlp.proj.weight",
        "blocks.1.attn.qkv.weight", "ln_f.weight", "head.weight"}) {
    EXPECT_EQ(names.count(n), 1u) << n;
  }
  EXPECT_EQ(names.count("blocks.2.attn.qkv.weight"), 0u);
  // Per block: 2 LayerNorms (2w each), qkv (3w*w + 3w), proj (w*w + w), mlp (4w*w + 4w + 4w*w + w).
  const int64_t w = 32, v = 256, t = 16;
  const int64_t block = 4 * w + (3 * w * w + 3 * w) + (w * w + w) + (8 * w * w + 5 * w);
  EXPECT_EQ(parameter_count(*m), v * w + t * w + 2 * block + 2 * w + w * v);
}

TEST_F(ModelsTest, GptInitialisation) {
  auto m = make_model(gpt_spec());
  auto p = m->named_parameters();
  EXPECT_NEAR(p["tok_emb.weight"].std().item<double>(), 0.02, 0.002);
  EXPECT_NEAR(p["blocks.0.attn.qkv.weight"].std().item<double>(), 0.02, 0.002);
  EXPECT_NEAR(p["blocks.0.mlp.proj.weight"].std().item<double>(), 0.01, 0.002);  // 0.02/sqrt(4)
  EXPECT_EQ(p["blocks.0.attn.qkv.bias"].abs().max().item<float>(), 0.0f);
  EXPECT_TRUE(p["ln_f.weight"].equal(torch::ones({32})));
}

// ---- GPT causality -------------------------------------------------------------------------

TEST_F(ModelsTest, GptIsCausal) {
  auto m = make_model(gpt_spec());
  torch::NoGradGuard no_grad;
  at::Tensor a = torch::randint(0, 256, {2, 16}, torch::kInt64);
  at::Tensor b = a.clone();
  const int64_t changed = 9;
  b.select(1, changed).add_(1).remainder_(256);
  const at::Tensor la = m->forward(a), lb = m->forward(b);
  EXPECT_TRUE(torch::equal(la.narrow(1, 0, changed), lb.narrow(1, 0, changed)))
      << "logits before the changed token moved";
  EXPECT_FALSE(torch::allclose(la.narrow(1, changed, 1), lb.narrow(1, changed, 1)))
      << "the changed token had no effect on its own position";
  EXPECT_FALSE(torch::allclose(la.narrow(1, 15, 1), lb.narrow(1, 15, 1)))
      << "later positions should see the change";
}

// ---- loss and accuracy ---------------------------------------------------------------------

TEST_F(ModelsTest, LossAndCorrect) {
  auto m = make_model({"mlp", {4}, 3, 8});
  const at::Tensor logits = torch::tensor({{2.f, 0.f, 0.f}, {0.f, 0.f, 5.f}, {1.f, 3.f, 0.f}});
  const at::Tensor targets = torch::tensor({0, 1, 1}, torch::kInt64);
  const at::Tensor expected = -torch::log_softmax(logits, 1).gather(1, targets.unsqueeze(1)).mean();
  EXPECT_NEAR(m->loss(logits, targets).item<double>(), expected.item<double>(), 1e-6);
  EXPECT_EQ(m->correct(logits, targets), (std::pair<int64_t, int64_t>{2, 3}));
}

TEST_F(ModelsTest, GptLossIsMeanOverAllPositions) {
  auto m = make_model(gpt_spec());
  const at::Tensor logits = torch::randn({2, 3, 256});
  const at::Tensor targets = torch::randint(0, 256, {2, 3}, torch::kInt64);
  double sum = 0;
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t t = 0; t < 3; ++t)
      sum -= torch::log_softmax(logits[b][t], 0)[targets[b][t].item<int64_t>()].item<double>();
  EXPECT_NEAR(m->loss(logits, targets).item<double>(), sum / 6, 1e-5);
  EXPECT_EQ(m->correct(logits, targets).second, 6);
}

// ---- factory errors ------------------------------------------------------------------------

TEST_F(ModelsTest, FactoryErrors) {
  expect_throw_containing<InvalidArgument>(
      [] {
        make_model({"resnet", {1, 28, 28}});
      },
      {"resnet", "mlp, cnn, gpt"});
  ModelSpec s = gpt_spec();
  s.heads = 5;
  expect_throw_containing<InvalidArgument>([&] { make_model(s); },
                                           {"model.heads", "model.width", "5", "32"});
  s = gpt_spec();
  s.input_shape = {32};
  expect_throw_containing<InvalidArgument>([&] { make_model(s); }, {"model.context", "32"});
  expect_throw_containing<InvalidArgument>([] { make_model({"cnn", {32}}); }, {"cnn"});
  expect_throw_containing<InvalidArgument>([] { make_model({"gpt", {1, 28, 28}, 256}); }, {"gpt"});
  auto m = make_model(gpt_spec());
  expect_throw_containing<InvalidArgument>(
      [&] {
        m->forward(torch::zeros({1, 17}, torch::kInt64));
      },
      {"17", "model.context"});
}

// ---- learning ------------------------------------------------------------------------------

TEST_F(ModelsTest, MlpLearnsSyntheticData) {
  const data::DataSplits splits = data::make_synthetic(3000, 32, 10, 0.2, 1);
  auto model = make_model({"mlp", splits.input_shape, splits.num_classes, 64});
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  data::GlobalBatchSampler sampler(splits.train.size(), 64, 1);
  for (int64_t step = 0; step < 200; ++step) {
    const auto [x, y] = data::gather(splits.train, sampler.indices(step, 0, 1));
    opt.zero_grad();
    model->loss(model->forward(x), y).backward();
    opt.step();
  }
  torch::NoGradGuard no_grad;
  const auto [hits, total] =
      model->correct(model->forward(splits.test->inputs), splits.test->targets);
  EXPECT_EQ(total, 600);
  EXPECT_GT(double(hits) / double(total), 0.9);
}

}  // namespace
}  // namespace krab::models
