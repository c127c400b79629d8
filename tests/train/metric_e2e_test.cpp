// train.metric through the krab binary: a regression model (a TorchScript linear module trained
// with mse on tensor files of float labels) reports the mean squared error of its model.pt on
// the test file, as PyTorch recomputes it, in every mode that evaluates (synchronous, parameter
// server, fl-sim); a built-in classifier keeps reporting accuracy; accuracy asked of a
// regression job is refused before training.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "cli/cli_support.h"
#include "core/fs.h"
#include "support/script_modules.h"

namespace {

using namespace krab::cli_test;

// reg_*.pt: y = x . w + 0.5 + noise, float32 labels [N]; the test split (300) is no multiple
// of the evaluation batch nor split evenly by batches of 16. cls_*.pt: 4 classes of 1x8x8
// images for the built-in cnn.
const char* kWriteData = R"PY(
import os, sys, torch
d = sys.argv[1]
g = torch.Generator().manual_seed(0)
w = torch.randn(8, generator=g)
def reg(n):
    x = torch.randn(n, 8, generator=g)
    return {"x": x, "y": x @ w + 0.5 + 0.1 * torch.randn(n, generator=g)}
torch.save(reg(512), os.path.join(d, "reg_train.pt"))
torch.save(reg(300), os.path.join(d, "reg_test.pt"))
v = torch.randn(64, 4, generator=g)
def cls(n):
    x = torch.randn(n, 1, 8, 8, generator=g)
    return {"x": x, "y": (x.flatten(1) @ v).argmax(1)}
torch.save(cls(256), os.path.join(d, "cls_train.pt"))
torch.save(cls(128), os.path.join(d, "cls_test.pt"))
)PY";

// The mean squared error on reg_test.pt (on its first N rows when N is set), in float64, of
// the initial module (reg.ts) and of each model.pt named: one number a line.
const char* kExpect = R"PY(
import os, sys, torch
d = torch.load(sys.argv[1])
n = int(os.environ.get("N", "0")) or len(d["y"])
x, y = d["x"][:n].double(), d["y"][:n].double()
def mse(w, b):
    return float(((x @ w.double().T + b.double()).squeeze(1) - y).pow(2).mean())
m = torch.jit.load(sys.argv[2])
print(repr(mse(m.weight, m.bias)))
for p in sys.argv[3:]:
    s = torch.load(p)
    print(repr(mse(s["weight"], s["bias"])))
)PY";

const char* kRegressionJob = R"(
model: {name: torchscript, path: reg.ts}
data: {name: tensors, path: reg_train.pt, test_path: reg_test.pt, batch_size: 16}
train: {steps: 12, loss: mse, eval_every: 6, optimizer: {name: sgd, lr: 0.05, momentum: 0.5}}
parallel: {workers: 2}
sync: {servers: 1}
federated: {rounds: 2, clients: 4, fraction: 0.5, local_steps: 6}
comm: {timeout_s: 20}
)";

class Metric : public Cli {
 protected:
  void SetUp() override {
    Cli::SetUp();
    write("write.py", kWriteData);
    ASSERT_EQ(run(python("write.py") + " " + dir_.string()).code, 0);
    krab::test::ScriptBuilder b;
    b.linear(8, 1).save((dir_ / "reg.ts").string());
    write("reg.yaml", kRegressionJob);
  }
  std::string python(const std::string& script) {
    return std::string(KRAB_PYTHON) + " " + (dir_ / script).string();
  }
  nlohmann::json report(const std::string& name) {
    return nlohmann::json::parse(krab::core::read_file((dir_ / name).string()));
  }
  // PyTorch's mean squared error on the test file (its first `n` rows; 0: all): of the initial
  // module, then of `model_pt`.
  std::vector<double> expected_mse(const std::string& model_pt, int n = 0) {
    write("expect.py", kExpect);
    const Result r = run("N=" + std::to_string(n) + " " + python("expect.py") + " " +
                         (dir_ / "reg_test.pt").string() + " " + (dir_ / "reg.ts").string() + " " +
                         (dir_ / model_pt).string());
    EXPECT_EQ(r.code, 0) << r.output;
    std::istringstream in(r.output);
    std::vector<double> v;
    for (double x; in >> x;) v.push_back(x);
    EXPECT_EQ(v.size(), 2u) << r.output;
    return v;
  }
  // The report's metric is the test loss, equal to PyTorch's MSE of model.pt (on the first `n`
  // test rows; 0: all) within 1e-5 relative, below the initial model's (training happened),
  // and every evaluation is a loss.
  void expect_test_loss(const nlohmann::json& r, const std::string& model_pt, int n = 0) {
    ASSERT_EQ(r.value("metric", ""), "loss") << r.dump();
    EXPECT_FALSE(r.contains("test_accuracy"));
    const std::vector<double> mse = expected_mse(model_pt, n);
    ASSERT_EQ(mse.size(), 2u);
    const double got = r["test_loss"].get<double>();
    EXPECT_LE(std::abs(got - mse[1]), 1e-5 * mse[1]) << got << " vs " << mse[1];
    EXPECT_LT(mse[1], 0.5 * mse[0]);
  }
};

TEST_F(Metric, SynchronousRunReportsTheTestMseOfItsModel) {
  const Result r = run(krab("train reg.yaml --report r.json"));
  ASSERT_EQ(r.code, 0) << r.output;
  const auto rep = report("r.json");
  expect_test_loss(rep, "runs/reg/model.pt");
  ASSERT_EQ(rep["evals"].size(), 2u) << rep["evals"].dump();  // steps 6 and 12
  for (const auto& e : rep["evals"]) {
    EXPECT_TRUE(e.contains("test_loss") && !e.contains("test_accuracy")) << e.dump();
    EXPECT_GT(e["test_loss"].get<double>(), 0);
  }
  EXPECT_EQ(rep["evals"][1]["test_loss"], rep["test_loss"]);
  EXPECT_NE(r.output.find("krab: test loss "), std::string::npos) << r.output;
}

// train.eval_examples 100 of the 300 test rows, in every mode that evaluates: the reported loss
// is PyTorch's MSE of model.pt on those 100 rows (not on all 300, which differs), and the
// report says how many it evaluated. The synchronous run's 2 workers take 50 rows each.
TEST_F(Metric, EvalExamplesScoresTheFirstNTestRowsInEveryMode) {
  int k = 0;
  for (const std::string how :
       {"train reg.yaml", "train reg.yaml --set sync.mode=async", "fl-sim reg.yaml"}) {
    SCOPED_TRACE(how);
    const std::string run_dir = "e" + std::to_string(k++);
    const Result r = run(krab(how + " --set train.eval_examples=100 --report r.json " +
                              "--set checkpoint.dir=" + run_dir));
    ASSERT_EQ(r.code, 0) << r.output;
    const auto rep = report("r.json");
    expect_test_loss(rep, run_dir + "/model.pt", 100);
    EXPECT_EQ(rep.value("eval_examples", 0), 100) << rep.dump();
    const std::vector<double> all = expected_mse(run_dir + "/model.pt");
    ASSERT_EQ(all.size(), 2u);
    EXPECT_GT(std::abs(rep["test_loss"].get<double>() - all[1]), 1e-4 * all[1]);
  }
}

TEST_F(Metric, ParameterServerReportsTheTestMseOfItsModel) {
  const Result r = run(krab("train reg.yaml --set sync.mode=async --report r.json"));
  ASSERT_EQ(r.code, 0) << r.output;
  const auto rep = report("r.json");
  expect_test_loss(rep, "runs/reg/model.pt");
  // Worker 0's evaluations of its snapshots (if it computed past step 6) travel to the chief as
  // losses; ps_rpc_test checks the wire field itself.
  ASSERT_GE(rep["evals"].size(), 1u) << rep["evals"].dump();
  for (const auto& e : rep["evals"]) {
    EXPECT_TRUE(e.contains("test_loss") && !e.contains("test_accuracy")) << e.dump();
    EXPECT_GT(e["test_loss"].get<double>(), 0) << e.dump();
  }
  EXPECT_NE(r.output.find("krab: test loss "), std::string::npos) << r.output;
}

TEST_F(Metric, FederatedSimulationReportsTheTestMseOfItsModel) {
  const Result r = run(krab("fl-sim reg.yaml --report r.json"));
  ASSERT_EQ(r.code, 0) << r.output;
  const auto rep = report("r.json");
  expect_test_loss(rep, "runs/reg/model.pt");
  ASSERT_EQ(rep["rounds"].size(), 2u);
  for (const auto& round : rep["rounds"]) EXPECT_TRUE(round.contains("test_loss")) << round.dump();
  EXPECT_EQ(rep["rounds"][1]["test_loss"], rep["test_loss"]);
  EXPECT_NE(r.output.find("krab: test loss "), std::string::npos) << r.output;
}

// auto is accuracy for a built-in model (the report as before, with "metric" beside it); loss
// when asked for, as the mean cross-entropy.
TEST_F(Metric, BuiltInCnnReportsAccuracyUnlessLossIsAsked) {
  write("cls.yaml", R"(
model: {name: cnn}
data: {name: tensors, path: cls_train.pt, test_path: cls_test.pt, batch_size: 32}
train: {steps: 4}
parallel: {workers: 1}
)");
  Result r = run(krab("train cls.yaml --report a.json"));
  ASSERT_EQ(r.code, 0) << r.output;
  auto rep = report("a.json");
  EXPECT_EQ(rep.value("metric", ""), "accuracy");
  EXPECT_FALSE(rep.contains("test_loss"));
  const double acc = rep["test_accuracy"].get<double>();
  EXPECT_TRUE(acc >= 0 && acc <= 1) << acc;
  EXPECT_TRUE(rep["evals"].back().contains("test_accuracy"));
  EXPECT_NE(r.output.find("krab: test accuracy "), std::string::npos) << r.output;

  r = run(krab("train cls.yaml --set train.metric=loss --report l.json"));
  ASSERT_EQ(r.code, 0) << r.output;
  rep = report("l.json");
  EXPECT_EQ(rep.value("metric", ""), "loss");
  EXPECT_FALSE(rep.contains("test_accuracy"));
  // 4 classes: an untrained cross-entropy is near log 4; a few steps stay well under 10.
  const double loss = rep["test_loss"].get<double>();
  EXPECT_TRUE(loss > 0 && loss < 10) << loss;
}

TEST_F(Metric, AccuracyOfARegressionIsRefusedBeforeTraining) {
  for (const char* how : {"train reg.yaml", "fl-sim reg.yaml"}) {
    const Result r = run(krab(std::string(how) + " --set train.metric=accuracy"));
    expect_refused(r, 2, "train.metric: accuracy needs class labels, but train.loss mse");
    EXPECT_EQ(r.output.find("rank"), std::string::npos) << r.output;  // no worker started
  }
  EXPECT_FALSE(fs::exists(dir_ / "runs"));
}

}  // namespace
