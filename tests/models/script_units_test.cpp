// The unit split of TorchScript modules (models/script_units.h): which children become units,
// why the others do not, and that the rewritten methods compute what the originals compute —
// outputs and gradients bit for bit, without a runner, through a runner that only counts, and
// through one that recomputes each unit in backward. The expectation is always the same file
// loaded by plain torch::jit::load and run through its own, untouched methods.
#include "models/script_units.h"

#include <caffe2/serialize/inline_container.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <map>

#include "core/errors.h"
#include "models/torchscript.h"
#include "support/script_modules.h"

namespace krab::models {
namespace {

namespace fs = std::filesystem;

// A residual block of a transformer's shape: x + tanh(fc(x)).
torch::jit::Module block(test::ScriptBuilder& b, int64_t width) {
  torch::jit::Module m = b.module("Block");
  m.register_module("fc", b.linear(width, width));
  m.define(R"(
def forward(self, x):
    return x + torch.tanh(self.fc.forward(x))
)");
  return m;
}

// GPT-like: a ModuleList of blocks iterated in forward, then a head. The forward is what
// torch.jit.script writes for `for b in self.blocks: x = b(x)` (unrolled, one getattr per
// element), so this is the graph a Python GPT loads as.
torch::jit::Module gpt_like(test::ScriptBuilder& b) {
  torch::jit::Module blocks = b.module("ModuleList");
  for (int i = 0; i < 3; ++i) blocks.register_module(std::to_string(i), block(b, 6));
  torch::jit::Module root = b.module("GptLike");
  root.register_module("blocks", blocks);
  root.register_module("head", b.linear(6, 3));
  root.define(R"(
def forward(self, x):
    blocks = self.blocks
    x = getattr(blocks, "0").forward(x)
    x = getattr(blocks, "1").forward(x)
    x = getattr(blocks, "2").forward(x)
    return self.head.forward(x)

def training_loss(self, x, y):
    return torch.cross_entropy_loss(self.forward(x), y)
)");
  return root;
}

// ResNet-like: a stem of the root's own, layer1..layer4 as top-level children, a head.
torch::jit::Module resnet_like(test::ScriptBuilder& b) {
  torch::jit::Module root = b.module("ResNetLike");
  root.register_parameter("stem", torch::randn({6, 6}).requires_grad_(true), false);
  for (int i = 1; i <= 4; ++i) root.register_module("layer" + std::to_string(i), block(b, 6));
  root.register_module("fc", b.linear(6, 3));
  root.define(R"(
def forward(self, x):
    x = torch.relu(torch.matmul(x, self.stem))
    x = self.layer1.forward(x)
    x = self.layer2.forward(x)
    x = self.layer3.forward(x)
    x = self.layer4.forward(x)
    return self.fc.forward(x)
)");
  return root;
}

// Children that cannot be units, each for one reason, beside one that can.
torch::jit::Module awkward(test::ScriptBuilder& b) {
  torch::jit::Module pair = b.module("Pair");
  pair.register_module("fc", b.linear(6, 6));
  pair.define(R"(
def forward(self, x):
    h = self.fc.forward(x)
    return h, -h
)");
  torch::jit::Module root = b.module("Awkward");
  root.register_module("ok", b.linear(6, 6));
  root.register_module("pair", pair);
  root.register_module("looped", b.linear(6, 6));
  root.register_module("twice", b.linear(6, 6));
  root.register_module("peeked", b.linear(6, 3));
  root.register_module("maybe", b.linear(6, 6));
  root.define(R"(
def forward(self, x):
    x = self.ok.forward(x)
    a, c = self.pair.forward(x)
    x = a * c
    for i in range(2):
        x = self.looped.forward(x)
    if x.numel() > 0:
        x = self.maybe.forward(x)
    x = self.twice.forward(self.twice.forward(x))
    return self.peeked.forward(x) + self.peeked.bias
)");
  return root;
}

// Sees every unit call, in order; runs the unit as it is.
struct CountingRunner : UnitRunner {
  std::vector<int> seen;
  at::Tensor run(int unit, const at::Tensor& x, const UnitForward& forward) override {
    seen.push_back(unit);
    return forward(x);
  }
};

// Activation checkpointing in miniature: the unit runs without keeping its activations, and a
// node attached to its output runs it again in backward and differentiates that run
// (docs/design/zero-sharding.md §3.5).
struct RecomputeNode : torch::autograd::Node {
  UnitForward forward;
  at::Tensor x;
  std::vector<at::Tensor> params;
  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    torch::autograd::AutoGradMode on(true);
    std::vector<at::Tensor> wrt{x.detach().requires_grad_(true)};
    wrt.insert(wrt.end(), params.begin(), params.end());
    const at::Tensor out = forward(wrt[0]);
    return torch::autograd::grad({out}, wrt, {grads[0]}, false, false, /*allow_unused=*/true);
  }
};

struct RecomputeRunner : UnitRunner {
  std::vector<std::vector<at::Tensor>> params;  // per unit
  int recomputed = 0;
  at::Tensor run(int unit, const at::Tensor& x, const UnitForward& forward) override {
    at::Tensor out;
    {
      torch::NoGradGuard no_grad;
      out = forward(x);
    }
    auto node = std::make_shared<RecomputeNode>();
    node->forward = [this, forward](const at::Tensor& h) {
      ++recomputed;
      return forward(h);
    };
    node->x = x;
    node->params = params.at(unit);
    node->set_next_edges(torch::autograd::collect_next_edges(x, node->params));
    torch::autograd::set_history(out, node);
    return out;
  }
};

class ScriptUnits : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("krab-units-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string save(const torch::jit::Module& m) {
    const std::string path = (dir_ / "net.ts").string();
    m.save(path);
    return path;
  }
  std::shared_ptr<TorchScriptModel> load(const std::string& path) {
    ModelSpec spec;
    spec.name = "torchscript";
    spec.path = path;
    spec.input_shape = {6};
    return std::dynamic_pointer_cast<TorchScriptModel>(make_model(spec));
  }

  fs::path dir_;
  test::ScriptBuilder b_;
};

TEST_F(ScriptUnits, PlansTheBlocksOfAModuleListAndTheHead) {
  const ScriptUnitPlan plan = plan_script_units(gpt_like(b_));
  EXPECT_EQ(plan.units, (std::vector<std::string>{"blocks.0", "blocks.1", "blocks.2", "head"}));
  EXPECT_TRUE(plan.gathered_whole.empty()) << plan.gathered_whole[0];
  // As loaded from a file, the model lists the same units.
  auto m = load(save(gpt_like(b_)));
  EXPECT_EQ(m->unit_candidates(), plan.units);
}

TEST_F(ScriptUnits, PlansTopLevelLayersInForwardOrder) {
  auto m = load(save(resnet_like(b_)));
  EXPECT_EQ(m->unit_candidates(),
            (std::vector<std::string>{"layer1", "layer2", "layer3", "layer4", "fc"}));
  EXPECT_TRUE(m->gathered_whole().empty());
}

// A root nn.Sequential, as torch.jit.script writes it: its parts are units, except one without
// parameters (nothing to gather).
TEST_F(ScriptUnits, PlansThePartsOfARootSequential) {
  torch::jit::Module relu = b_.module("ReLU");
  relu.define(R"(
def forward(self, x):
    return torch.relu(x)
)");
  torch::jit::Module root = b_.module("Sequential");
  root.register_module("0", b_.linear(6, 6));
  root.register_module("1", relu);
  root.register_module("2", b_.linear(6, 3));
  root.define(R"(
def forward(self, input):
    _0 = getattr(self, "0")
    _1 = getattr(self, "1")
    _2 = getattr(self, "2")
    input0 = (_0).forward(input, )
    input1 = (_1).forward(input0, )
    return (_2).forward(input1, )
)");
  auto m = load(save(root));
  EXPECT_EQ(m->unit_candidates(), (std::vector<std::string>{"0", "2"}));
  EXPECT_TRUE(m->gathered_whole().empty());
}

TEST_F(ScriptUnits, ReportsWhatItCannotSplit) {
  auto m = load(save(awkward(b_)));
  EXPECT_EQ(m->unit_candidates(), (std::vector<std::string>{"ok"}));
  EXPECT_EQ(m->gathered_whole(),
            (std::vector<std::string>{"looped: called inside a loop",
                                      "maybe: called inside a branch (if)", "pair: returns a tuple",
                                      "peeked: its attribute peeked.bias is read outside its "
                                      "forward",
                                      "twice: called 2 times in one run of forward"}));
}

// A module whose forward reaches its children in a method of its own: nothing there is a unit.
TEST_F(ScriptUnits, ChildrenReachedInOtherMethodsAreNotUnits) {
  torch::jit::Module root = b_.module("Helper");
  root.register_module("a", b_.linear(6, 6));
  root.register_module("b", b_.linear(6, 3));
  root.define(R"(
def features(self, x):
    return self.a.forward(x)

def forward(self, x):
    return self.b.forward(self.features(x))
)");
  const ScriptUnitPlan plan = plan_script_units(root);
  EXPECT_EQ(plan.units, (std::vector<std::string>{"b"}));
  EXPECT_EQ(plan.gathered_whole, (std::vector<std::string>{"a: reached in method features"}));
}

// A child called beside its own submodule: neither owns its parameters alone.
TEST_F(ScriptUnits, NestedCallsAreNotUnits) {
  torch::jit::Module root = b_.module("Nested");
  root.register_module("a", block(b_, 6));
  root.register_module("b", b_.linear(6, 3));
  root.define(R"(
def forward(self, x):
    return self.b.forward(self.a.forward(x) + self.a.fc.forward(x))
)");
  const ScriptUnitPlan plan = plan_script_units(root);
  EXPECT_EQ(plan.units, (std::vector<std::string>{"b"}));
  EXPECT_EQ(plan.gathered_whole,
            (std::vector<std::string>{"a: overlaps a.fc, which is called too",
                                      "a.fc: overlaps a, which is called too"}));
}

// Runs `m` (through its rewritten methods) and the plain module of the same file (through the
// originals) on the same batch; outputs and every parameter's gradient must be bit-equal.
void expect_same_as_original(TorchScriptModel& m, const std::string& path, const std::string& what,
                             const at::Tensor& x = torch::randn({5, 6}),
                             const at::Tensor& y = torch::randint(0, 3, {5})) {
  torch::jit::Module plain = torch::jit::load(path);
  if (!m.is_training()) plain.eval();
  m.zero_grad();
  const at::Tensor out = m.forward(x);
  m.loss(out, y).backward();
  at::Tensor expected;
  {
    torch::jit::GraphOptimizerEnabledGuard eager_autograd(false);
    expected = plain.forward({x}).toTensor();
  }
  m.loss(expected, y).backward();
  EXPECT_TRUE(torch::equal(out, expected)) << what << ": outputs differ";
  const auto params = m.named_parameters();
  for (const auto& p : plain.named_parameters()) {
    ASSERT_TRUE(params[p.name].grad().defined()) << what << ": " << p.name << " has no gradient";
    EXPECT_TRUE(torch::equal(params[p.name].grad(), p.value.grad()))
        << what << ": " << p.name << "'s gradient differs";
  }
}

TEST_F(ScriptUnits, RewrittenForwardEqualsTheOriginalBitForBit) {
  for (const auto& [name, module] :
       {std::pair{"gpt-like", gpt_like(b_)}, std::pair{"resnet-like", resnet_like(b_)},
        std::pair{"awkward", awkward(b_)}}) {
    const std::string path = save(module);
    auto m = load(path);
    m->train();
    expect_same_as_original(*m, path, std::string(name) + " without a runner");

    CountingRunner counting;
    std::vector<int> mapping;
    for (size_t i = 0; i < m->unit_candidates().size(); ++i) mapping.push_back(10 + i);
    m->set_unit_runner(&counting, mapping);
    expect_same_as_original(*m, path, std::string(name) + " with a counting runner");
    EXPECT_EQ(counting.seen, mapping) << name << ": each unit once per forward, in order";
    m->set_unit_runner(nullptr, {});
  }
}

TEST_F(ScriptUnits, TrainingLossRunsTheUnitsOfTheRewrittenForward) {
  const std::string path = save(gpt_like(b_));
  auto m = load(path);
  CountingRunner counting;
  m->set_unit_runner(&counting, {0, 1, 2, 3});
  const at::Tensor x = torch::randn({5, 6});
  const at::Tensor y = torch::randint(0, 3, {5});
  const at::Tensor loss = m->training_loss(x, y);
  EXPECT_EQ(counting.seen, (std::vector<int>{0, 1, 2, 3}));
  torch::jit::Module plain = torch::jit::load(path);
  torch::jit::GraphOptimizerEnabledGuard eager_autograd(false);
  EXPECT_TRUE(torch::equal(loss, plain.get_method("training_loss")({x, y}).toTensor()));
}

TEST_F(ScriptUnits, PredictRunsTheUnitsOfTheRewrittenForward) {
  torch::jit::Module net = resnet_like(b_);
  net.define(R"(
def predict(self, x):
    return -self.forward(x)
)");
  const std::string path = save(net);
  auto m = load(path);
  CountingRunner counting;
  m->set_unit_runner(&counting, {0, 1, 2, 3, 4});
  const at::Tensor x = torch::randn({5, 6});
  const at::Tensor out = m->predict(x);
  EXPECT_EQ(counting.seen, (std::vector<int>{0, 1, 2, 3, 4}));
  torch::jit::Module plain = torch::jit::load(path);
  torch::jit::GraphOptimizerEnabledGuard eager_autograd(false);
  EXPECT_TRUE(torch::equal(out, plain.get_method("predict")({x}).toTensor()));
}

// A name the rewrite would take is the user's already: the module trains whole, and says why.
TEST_F(ScriptUnits, ANameClashLeavesTheModuleWhole) {
  torch::jit::Module net = resnet_like(b_);
  net.define(R"(
def __krab_forward(self, x):
    return x
)");
  const std::string path = save(net);
  auto m = load(path);
  EXPECT_TRUE(m->unit_candidates().empty());
  EXPECT_EQ(m->gathered_whole(),
            (std::vector<std::string>{"nothing split: the module already has a method "
                                      "__krab_forward"}));
  expect_same_as_original(*m, path, "whole");
  const std::string out = (dir_ / "model.ts").string();
  m->save(out);  // the user's own method stays in model.ts
  EXPECT_TRUE(torch::jit::load(out).find_method("__krab_forward").has_value());
}

// A runner's failure (a gather that timed out) reaches the caller as itself, not as a failure
// of the user's code: the interpreter between them would turn it into a std::runtime_error.
TEST_F(ScriptUnits, ARunnersErrorKeepsItsType) {
  struct FailingRunner : UnitRunner {
    at::Tensor run(int, const at::Tensor&, const UnitForward&) override {
      throw Timeout("all_gather of unit 1 timed out");
    }
  } failing;
  auto m = load(save(gpt_like(b_)));
  m->set_unit_runner(&failing, {0, 1, 2, 3});
  try {
    m->forward(torch::randn({5, 6}));
    FAIL() << "no Timeout";
  } catch (const Timeout& e) {
    EXPECT_STREQ(e.what(), "all_gather of unit 1 timed out");
  }
}

TEST_F(ScriptUnits, RecomputedUnitsGiveTheSameGradients) {
  for (const auto& [name, module] :
       {std::pair{"gpt-like", gpt_like(b_)}, std::pair{"resnet-like", resnet_like(b_)}}) {
    const std::string path = save(module);
    auto m = load(path);
    m->train();
    RecomputeRunner recompute;
    const auto params = m->named_parameters();
    std::vector<int> mapping;
    for (const std::string& unit : m->unit_candidates()) {
      mapping.push_back(static_cast<int>(recompute.params.size()));
      recompute.params.emplace_back();
      for (const auto& p : params)
        if (p.key().rfind(unit + ".", 0) == 0) recompute.params.back().push_back(p.value());
    }
    m->set_unit_runner(&recompute, mapping);
    expect_same_as_original(*m, path, std::string(name) + " recomputed");
    EXPECT_EQ(recompute.recomputed, static_cast<int>(mapping.size())) << name;
  }
}

// The issue-25 layer zoo (write_layer_zoo.py), as torch.jit.script writes it: the stem, the
// blocks of its ModuleList, the LayerNorm and the head are units; the LSTM (an overloaded
// forward) and the attention (seven inputs) train whole; outputs and gradients are the
// original's, bit for bit.
TEST_F(ScriptUnits, SplitsWhatPythonScriptsForTorchNnLayers) {
  const std::string path = (dir_ / "zoo.ts").string();
  const std::string cmd =
      std::string(KRAB_PYTHON) + " " + KRAB_SOURCE_DIR + "/tests/models/write_layer_zoo.py " + path;
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  auto m = load(path);
  EXPECT_EQ(m->unit_candidates(),
            (std::vector<std::string>{"stem", "blocks.0", "blocks.1", "norm", "head"}));
  EXPECT_EQ(m->gathered_whole(),
            (std::vector<std::string>{"attention: takes 7 inputs",
                                      "lstm: its method forward__0 is called"}));
  m->eval();  // dropout off: the two runs draw no random numbers
  CountingRunner counting;
  m->set_unit_runner(&counting, {0, 1, 2, 3, 4});
  expect_same_as_original(*m, path, "zoo", torch::randn({2, 3, 16, 16}), torch::tensor({1, 7}));
  EXPECT_EQ(counting.seen, (std::vector<int>{0, 1, 2, 3, 4}));
}

// model.ts is read by Python's torch.jit.load, which knows no krab operator: the file holds the
// user's methods only, and still computes what the trained module computes.
TEST_F(ScriptUnits, SavedModelHoldsNoKrabCode) {
  auto m = load(save(gpt_like(b_)));
  ASSERT_FALSE(m->unit_candidates().empty());
  const std::string out = (dir_ / "model.ts").string();
  m->save(out);
  caffe2::serialize::PyTorchStreamReader reader(out);
  const std::vector<std::string> records = reader.getAllRecords();
  ASSERT_FALSE(records.empty());
  for (const std::string& name : records) {
    const auto [data, size] = reader.getRecord(name);
    const std::string bytes(static_cast<const char*>(data.get()), size);
    EXPECT_EQ(bytes.find("krab"), std::string::npos) << name << " mentions krab";
  }
  torch::jit::Module back = torch::jit::load(out);
  EXPECT_FALSE(back.find_method("__krab_forward").has_value());
  const std::string python =
      std::string(KRAB_PYTHON) + " -c 'import sys, torch; torch.jit.load(sys.argv[1])' " + out;
  EXPECT_EQ(std::system(python.c_str()), 0) << python;
  m->eval();
  const at::Tensor x = torch::randn({5, 6});
  torch::jit::GraphOptimizerEnabledGuard eager_autograd(false);
  EXPECT_TRUE(torch::equal(back.forward({x}).toTensor(), m->forward(x)));
}

}  // namespace
}  // namespace krab::models
