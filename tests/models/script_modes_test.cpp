// Modules as Python's torch.jit.trace and torch.jit.script write them (write_mode_modules.py):
// train/eval flags frozen by a trace (models/script_modes.h) and buffers whose persistence the
// file does not record (models::TorchScriptModel::warnings).
#include "models/script_modes.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>

#include "core/errors.h"
#include "models/torchscript.h"

namespace krab::models {
namespace {

namespace fs = std::filesystem;

class ScriptModes : public ::testing::Test {
 protected:
  // One Python run writes every module of the suite (importing torch costs a second or two).
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("krab-modes-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    const std::string cmd = std::string(KRAB_PYTHON) + " " + KRAB_SOURCE_DIR +
                            "/tests/models/write_mode_modules.py " + dir_.string();
    written_ = std::system(cmd.c_str()) == 0;
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }
  void SetUp() override { ASSERT_TRUE(written_) << "write_mode_modules.py failed"; }

  static std::string path(const std::string& name) { return (dir_ / name).string(); }
  static ModelSpec spec(const std::string& name) {
    ModelSpec s;
    s.name = "torchscript";
    s.path = path(name);
    s.input_shape = {32};
    return s;
  }
  static std::shared_ptr<TorchScriptModel> load(const std::string& name) {
    return std::dynamic_pointer_cast<TorchScriptModel>(make_model(spec(name)));
  }

  static fs::path dir_;
  static bool written_;
};
fs::path ScriptModes::dir_;
bool ScriptModes::written_ = false;

std::string describe(const std::vector<FrozenModeCall>& calls) {
  std::string out;
  for (const auto& c : calls)
    out += c.where + " " + c.op + " " + c.argument + "=" + (c.value ? "true" : "false") + "; ";
  return out;
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// Traced in train mode: BatchNorm and Dropout run with training=True whatever the mode, so
// evaluation would update the running statistics and drop activations. Refused, naming the
// file, the submodule, the operator and the fix, with model.trust_code too (it is about what
// the module computes, not what it reaches).
TEST_F(ScriptModes, RefusesATraceMadeInTrainMode) {
  const auto calls = frozen_mode_calls(torch::jit::load(path("train_trace.ts")));
  EXPECT_EQ(describe(calls),
            "bn.forward aten::batch_norm training=true; drop.forward aten::dropout train=true; ");
  for (const bool trust : {false, true}) {
    ModelSpec s = spec("train_trace.ts");
    s.trust_code = trust;
    try {
      make_model(s);
      ADD_FAILURE() << "a trace in train mode was accepted (trust_code " << trust << ")";
    } catch (const InvalidArgument& e) {
      const std::string what = e.what();
      EXPECT_TRUE(contains(what, "model.path: '" + s.path +
                                     "': bn.forward calls "
                                     "aten::batch_norm with training fixed to true"))
          << what;
      EXPECT_TRUE(contains(what, "torch.jit.script")) << what;
      EXPECT_TRUE(contains(what, "after model.eval()")) << what;
      EXPECT_FALSE(contains(what, "\n")) << what;
    }
  }
}

// torch.jit.script reads every flag from `training`: BatchNorm, InstanceNorm with running
// statistics, four kinds of dropout, RReLU and an LSTM with dropout between its layers. Nothing
// is frozen, nothing refused or warned of, and train() / eval() reach the layers.
TEST_F(ScriptModes, AcceptsAScriptedModuleWhoseFlagsFollowTraining) {
  EXPECT_EQ(describe(frozen_mode_calls(torch::jit::load(path("script.ts")))), "");
  auto m = load("script.ts");
  EXPECT_TRUE(m->warnings().empty()) << m->warnings().front();
  const at::Tensor x = torch::randn({8, 32});
  torch::NoGradGuard no_grad;
  m->eval();
  EXPECT_TRUE(torch::equal(m->forward(x), m->forward(x))) << "eval mode is not deterministic";
  m->train();
  EXPECT_FALSE(torch::equal(m->forward(x), m->forward(x))) << "train mode reaches no dropout";
}

// Traced in train mode, but every flag it fixed cannot change the result: BatchNorm and
// InstanceNorm without running statistics use the batch's in both modes (in Python too),
// Dropout(p=0) and an LSTM without dropout drop nothing. Accepted.
TEST_F(ScriptModes, AcceptsFlagsThatCannotChangeTheResult) {
  EXPECT_EQ(describe(frozen_mode_calls(torch::jit::load(path("stateless_trace.ts")))), "");
  EXPECT_TRUE(load("stateless_trace.ts")->warnings().empty());
}

// Traced in eval mode: training runs the eval computation (BatchNorm on its running statistics,
// never updated; no dropout), which evaluation and Python's module in eval mode reproduce.
// Accepted with one warning naming the calls.
TEST_F(ScriptModes, WarnsOfATraceMadeInEvalMode) {
  auto m = load("eval_trace.ts");
  ASSERT_EQ(m->warnings().size(), 1u);
  const std::string& w = m->warnings()[0];
  EXPECT_TRUE(contains(w,
                       "was traced in eval mode: bn.forward (aten::batch_norm), drop.forward "
                       "(aten::dropout) run as in eval in training too"))
      << w;
  const at::Tensor x = torch::randn({8, 32});
  const at::Tensor mean = m->named_buffers()["bn.running_mean"].clone();
  torch::NoGradGuard no_grad;
  m->train();
  EXPECT_TRUE(torch::equal(m->forward(x), m->forward(x)));
  EXPECT_TRUE(torch::equal(m->named_buffers()["bn.running_mean"], mean));
}

// TorchScript does not record persistent=False: the module's state holds `scratch`, which the
// Python module's state_dict() does not, so model.pt (written from that state) has one key more
// than load_state_dict(strict=True) takes. The warning names every such key; it names the
// persistent `keep` of the same class too (the file cannot tell them apart) and not the buffers
// of torch.nn's BatchNorm.
TEST_F(ScriptModes, WarnsOfBuffersModelPtMayHoldThatPythonsStateDictDoesNot) {
  auto m = load("nonpersistent.ts");
  std::set<std::string> python;
  std::ifstream keys(path("nonpersistent.keys"));
  for (std::string k; std::getline(keys, k);) python.insert(k);
  ASSERT_TRUE(python.count("keep") && python.count("body.bn.running_mean"));
  std::vector<std::string> extra;
  for (const auto& p : m->named_parameters()) EXPECT_TRUE(python.count(p.key())) << p.key();
  for (const auto& b : m->named_buffers())
    if (!python.count(b.key())) extra.push_back(b.key());
  ASSERT_EQ(extra, std::vector<std::string>{"scratch"});
  ASSERT_EQ(m->warnings().size(), 1u);
  const std::string& w = m->warnings()[0];
  EXPECT_TRUE(contains(w, "model.pt will hold the buffers keep, scratch of your own classes")) << w;
  EXPECT_TRUE(contains(w, "persistent=False")) << w;
  EXPECT_FALSE(contains(w, "running_mean")) << w;
}

}  // namespace
}  // namespace krab::models
