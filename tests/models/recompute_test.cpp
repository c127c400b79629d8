// Units of the built-in models and activation checkpointing (models/recompute.h): the unit
// call sites, bit-identical gradients with recomputation (gpt, cnn, mlp; several micro-batches;
// two threads), the autograd node's edges and hooks, the generator restore, and the memory an
// un-recomputed forward keeps against a recomputed one.
#include "models/recompute.h"

#include <gtest/gtest.h>
#include <malloc.h>
#include <torch/torch.h>

#include <map>
#include <thread>

#include "models/model.h"

namespace krab::models {
namespace {

ModelSpec gpt_spec(int64_t layers = 3) {
  ModelSpec s;
  s.name = "gpt";
  s.input_shape = {16};
  s.num_classes = 64;
  s.layers = layers;
  s.width = 32;
  s.heads = 4;
  s.context = 16;
  return s;
}

ModelSpec cnn_spec() {
  ModelSpec s;
  s.name = "cnn";
  s.input_shape = {1, 12, 12};
  return s;
}

ModelSpec mlp_spec() {
  ModelSpec s;
  s.name = "mlp";
  s.input_shape = {20};
  s.hidden = 24;
  return s;
}

struct Batch {
  at::Tensor x, y;
};

// `n` micro-batches of 4 examples the spec's model takes, from a fixed seed.
std::vector<Batch> batches(const ModelSpec& spec, int n) {
  torch::manual_seed(7);
  std::vector<Batch> out;
  for (int i = 0; i < n; ++i) {
    if (spec.name == "gpt") {
      out.push_back({torch::randint(0, spec.num_classes, {4, 16}, torch::kInt64),
                     torch::randint(0, spec.num_classes, {4, 16}, torch::kInt64)});
    } else {
      std::vector<int64_t> shape{4};
      shape.insert(shape.end(), spec.input_shape.begin(), spec.input_shape.end());
      out.push_back({torch::randn(shape), torch::randint(0, spec.num_classes, {4}, torch::kInt64)});
    }
  }
  return out;
}

std::shared_ptr<Model> build(const ModelSpec& spec) {
  torch::manual_seed(0);
  return make_model(spec);
}

// Forward and backward of every micro-batch, gradients accumulating; name -> gradient.
std::map<std::string, at::Tensor> accumulate(Model& model, const std::vector<Batch>& data) {
  for (const Batch& b : data) model.loss(model.forward(b.x), b.y).backward();
  std::map<std::string, at::Tensor> grads;
  for (const auto& item : model.named_parameters()) grads[item.key()] = item.value().grad().clone();
  return grads;
}

void expect_bit_identical(const std::map<std::string, at::Tensor>& plain,
                          const std::map<std::string, at::Tensor>& recomputed) {
  ASSERT_EQ(plain.size(), recomputed.size());
  for (const auto& [name, g] : plain) {
    ASSERT_TRUE(g.defined()) << name;
    EXPECT_GT(g.abs().max().item<double>(), 0.0) << name << ": no gradient to compare";
    EXPECT_TRUE(torch::equal(g, recomputed.at(name))) << name;
  }
}

class RecomputeTest : public ::testing::Test {
 protected:
  void SetUp() override { torch::set_num_threads(1); }
};

// Records the units it is asked to run and runs them directly.
class RecordingRunner : public UnitRunner {
 public:
  at::Tensor run(int unit, const at::Tensor& x, const UnitForward& forward) override {
    calls.push_back(unit);
    return forward(x);
  }
  std::vector<int> calls;
};

TEST_F(RecomputeTest, CandidatesAreSubmodulesInForwardOrder) {
  const std::map<std::string, std::vector<std::string>> expected = {
      {"gpt", {"blocks.0", "blocks.1", "blocks.2"}},
      {"cnn", {"conv1", "conv2", "fc1", "fc2"}},
      {"mlp", {"fc1", "fc2", "fc3"}}};
  for (const ModelSpec& spec : {gpt_spec(), cnn_spec(), mlp_spec()}) {
    auto model = build(spec);
    EXPECT_EQ(model->unit_candidates(), expected.at(spec.name)) << spec.name;
    const auto modules = model->named_modules();
    for (const std::string& path : model->unit_candidates())
      EXPECT_NE(modules.find(path), nullptr) << spec.name << ": " << path;

    // A runner sees every candidate once per forward, in order, and (running them directly)
    // leaves the logits bit-identical to the model without a runner.
    const Batch b = batches(spec, 1)[0];
    torch::NoGradGuard no_grad;
    const at::Tensor direct = model->forward(b.x);
    RecordingRunner runner;
    // Candidate i -> unit 10 + i: the mapping is the installer's, not the candidate index.
    std::vector<int> units, want;
    for (size_t i = 0; i < model->unit_candidates().size(); ++i) {
      units.push_back(10 + static_cast<int>(i));
      want.push_back(10 + static_cast<int>(i));
    }
    model->set_unit_runner(&runner, units);
    EXPECT_TRUE(torch::equal(model->forward(b.x), direct)) << spec.name;
    EXPECT_EQ(runner.calls, want) << spec.name;
    model->set_unit_runner(nullptr, {});
  }
}

// The "identical gradients": checkpointing every unit changes no bit of any gradient,
// accumulated over three micro-batches, for each built-in model.
TEST_F(RecomputeTest, GradientsAreBitIdenticalForEveryBuiltInModel) {
  for (const ModelSpec& spec : {gpt_spec(), cnn_spec(), mlp_spec()}) {
    SCOPED_TRACE(spec.name);
    const auto data = batches(spec, 3);
    auto plain = build(spec);
    auto recomputed = build(spec);
    RecomputeRunner runner(*recomputed);
    EXPECT_EQ(runner.units(), recomputed->unit_candidates().size());
    runner.install(*recomputed);
    expect_bit_identical(accumulate(*plain, data), accumulate(*recomputed, data));
  }
}

// Thread-ranks train one model per thread: two threads recomputing at once (reentrant
// backward on each) still give the plain gradients.
TEST_F(RecomputeTest, TwoThreadsRecomputingAtOnceGiveThePlainGradients) {
  const ModelSpec spec = gpt_spec(2);
  const auto data = batches(spec, 2);
  const auto expected = accumulate(*build(spec), data);
  std::vector<std::shared_ptr<Model>> models{build(spec), build(spec)};
  std::vector<std::unique_ptr<RecomputeRunner>> runners;
  std::vector<std::map<std::string, at::Tensor>> got(2);
  for (auto& m : models) {
    runners.push_back(std::make_unique<RecomputeRunner>(*m));
    runners.back()->install(*m);
  }
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t)
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 3; ++rep) {
        for (auto& p : models[t]->parameters()) p.mutable_grad() = at::Tensor();
        got[t] = accumulate(*models[t], data);
      }
    });
  for (auto& th : threads) th.join();
  for (int t = 0; t < 2; ++t) expect_bit_identical(expected, got[t]);
}

// The node's edges: the output's grad_fn is the recompute node; a parameter's gradient reaches
// its AccumulateGrad once per backward (its hooks fire once, as DataParallel's need); the
// input's gradient reaches whatever produced the input.
TEST_F(RecomputeTest, OneNodeWhoseGradientsReachTheInputAndEachParameterOnce) {
  torch::manual_seed(3);
  torch::nn::Linear inner(6, 5);
  const at::Tensor w0 = torch::randn({6, 6}, torch::requires_grad());
  const at::Tensor x0 = torch::randn({3, 6});
  auto unit = [&](const at::Tensor& h) { return torch::tanh(inner->forward(h)).pow(2); };

  const at::Tensor plain_out = unit(torch::matmul(x0, w0));
  plain_out.sum().backward();
  const at::Tensor plain_w0 = w0.grad().clone(), plain_w = inner->weight.grad().clone();
  w0.mutable_grad() = at::Tensor();
  inner->weight.mutable_grad() = at::Tensor();
  inner->bias.mutable_grad() = at::Tensor();

  int weight_hooks = 0;
  inner->weight.register_hook([&](const at::Tensor&) { ++weight_hooks; });
  const at::Tensor out = run_recomputed(torch::matmul(x0, w0), inner->parameters(), unit);
  ASSERT_NE(out.grad_fn(), nullptr);
  EXPECT_EQ(out.grad_fn()->name(), "krab::RecomputeBackward");
  EXPECT_TRUE(torch::equal(out, plain_out));
  out.sum().backward();
  EXPECT_EQ(weight_hooks, 1);
  EXPECT_TRUE(torch::equal(inner->weight.grad(), plain_w));
  EXPECT_TRUE(torch::equal(w0.grad(), plain_w0));  // through x, to the matmul before the unit
}

// Without gradients (evaluation) a recomputed unit is just the unit: no node, same values.
TEST_F(RecomputeTest, WithoutGradientsTheUnitRunsDirectly) {
  auto model = build(gpt_spec());
  const Batch b = batches(gpt_spec(), 1)[0];
  torch::NoGradGuard no_grad;
  const at::Tensor direct = model->forward(b.x);
  RecomputeRunner runner(*model);
  runner.install(*model);
  const at::Tensor through = model->forward(b.x);
  EXPECT_TRUE(torch::equal(through, direct));
  EXPECT_EQ(through.grad_fn(), nullptr);
}

// A unit that draws from the CPU generator (dropout-like) is recomputed from the generator
// state of its first run, and the generator ends where the plain run leaves it.
TEST_F(RecomputeTest, ARandomUnitIsRecomputedWithItsOwnRandomNumbers) {
  const at::Tensor w = torch::randn({8, 8}, torch::requires_grad());
  const at::Tensor x = torch::randn({4, 8});
  auto unit = [&](const at::Tensor& h) {
    return torch::matmul(h, w) * (torch::rand({4, 8}) > 0.5).to(torch::kFloat);
  };
  torch::manual_seed(11);
  unit(x).pow(2).sum().backward();
  const at::Tensor plain = w.grad().clone(), plain_next = torch::rand({3});
  w.mutable_grad() = at::Tensor();

  torch::manual_seed(11);
  run_recomputed(x, {w}, unit).pow(2).sum().backward();
  EXPECT_TRUE(torch::equal(w.grad(), plain));
  EXPECT_TRUE(torch::equal(torch::rand({3}), plain_next));
}

// Bytes in use by malloc (all arenas and mmapped chunks); LibTorch's CPU allocator is malloc.
size_t bytes_in_use() {
  const struct mallinfo2 m = mallinfo2();
  return m.uordblks + m.hblkhd;
}

// What a forward keeps alive for backward, measured as the bytes still allocated after it:
// recomputing every block keeps each block's input (the closed form below) and the root's
// activations, and under half of what the plain forward keeps.
TEST_F(RecomputeTest, ARecomputedForwardKeepsLessMemory) {
  ModelSpec spec = gpt_spec(4);
  spec.num_classes = 8;  // a small head, so the blocks' activations dominate
  spec.width = 64;
  spec.context = spec.input_shape[0] = 64;
  const at::Tensor x = torch::randint(0, 8, {8, 64}, torch::kInt64);
  const at::Tensor y = torch::randint(0, 8, {8, 64}, torch::kInt64);
  auto kept = [&](bool recompute) {
    auto model = build(spec);
    RecomputeRunner runner(*model);
    if (recompute) runner.install(*model);
    const size_t before = bytes_in_use();
    at::Tensor loss = model->loss(model->forward(x), y);
    const size_t after = bytes_in_use();
    loss.backward();
    return static_cast<double>(after) - static_cast<double>(before);
  };
  const double plain = kept(false), recomputed = kept(true);
  if (plain <= 0) GTEST_SKIP() << "malloc's statistics are not observable here (a sanitizer?)";
  const double block_inputs = 4.0 * 8 * 64 * 64 * sizeof(float);
  EXPECT_GE(recomputed, block_inputs);
  EXPECT_LT(recomputed, 0.5 * plain) << "plain " << plain << " B, recomputed " << recomputed;
  std::printf("forward keeps %.0f KiB plain, %.0f KiB recomputed\n", plain / 1024,
              recomputed / 1024);
}

}  // namespace
}  // namespace krab::models
