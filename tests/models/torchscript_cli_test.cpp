// `krab train` with `model: {name: torchscript}`, run as a user would: the determinism contract
// with BatchNorm, model.ts, and each bad input refused before training with one line.
#include <caffe2/serialize/inline_container.h>
#include <torch/torch.h>

#include <map>
#include <set>

#include "cli/cli_support.h"
#include "support/script_modules.h"

namespace krab::cli_test {
namespace {

// The largest relative difference, max|a - b| / max|b|, over the floating-point tensors: finer
// than cli_support.h's norm-based max_rel_diff, and blind to integer buffers such as
// num_batches_tracked.
double max_elementwise_rel_diff(const std::map<std::string, at::Tensor>& a,
                                const std::map<std::string, at::Tensor>& b) {
  double worst = 0;
  for (const auto& [k, t] : a) {
    EXPECT_TRUE(b.count(k)) << k;
    if (!b.count(k)) return 1e9;
    if (!t.is_floating_point()) continue;
    const double diff = (t - b.at(k)).abs().max().item<double>();
    worst = std::max(worst, diff / std::max(b.at(k).abs().max().item<double>(), 1e-12));
  }
  return worst;
}

class TorchScriptCli : public Cli {
 protected:
  // Saves `m` as net.ts in the test's directory and writes a job that trains it.
  void job(const torch::jit::Module& m, const std::string& extra = "") {
    m.save((dir_ / "net.ts").string());
    write_job(extra);
  }
  // Writes a job that trains net.ts, whoever wrote it.
  void write_job(const std::string& extra = "") {
    write("job.yaml", R"(
model: {name: torchscript, path: net.ts}
data: {name: synthetic, synthetic_samples: 2048, synthetic_features: 32, batch_size: 32}
train: {steps: 10, optimizer: {name: sgd, lr: 0.05, momentum: 0.9}}
parallel: {workers: 2}
comm: {timeout_s: 20}
)" + extra);
  }
  test::ScriptBuilder b_;
};

// The determinism contract for a model with BatchNorm. In train mode BatchNorm normalises with
// the statistics of the batch it sees: 2 workers see two batches of 32, one worker one batch of
// 64, so their gradients differ by design (DDP's too). With model.freeze_batchnorm BatchNorm is
// in eval mode in both runs (its running statistics, the same on every rank), each example's
// gradient is independent of its batch, and the runs must end equal.
TEST_F(TorchScriptCli, TwoWorkersMatchOneWorkerWithBatchNormInEval) {
  job(b_.net(32, 16, 4), "");
  const std::string set = " --set model.freeze_batchnorm=true";
  auto multi = run(krab("train job.yaml --set checkpoint.dir=w2" + set));
  ASSERT_EQ(multi.code, 0) << multi.output;
  auto single =
      run(krab("train job.yaml --set checkpoint.dir=w1 --set parallel.workers=1 "
               "--set data.batch_size=64" +
               set));
  ASSERT_EQ(single.code, 0) << single.output;
  auto a = load_model_pt((dir_ / "w2/model.pt").string());
  auto b = load_model_pt((dir_ / "w1/model.pt").string());
  ASSERT_TRUE(a.count("body.fc.weight") && a.count("bn.running_var") &&
              a.count("bn.num_batches_tracked"));
  EXPECT_LE(max_elementwise_rel_diff(a, b), 1e-5);
  // Training moved the parameters (the comparison is not vacuous); BatchNorm's statistics did
  // not move (frozen).
  torch::jit::Module saved = torch::jit::load((dir_ / "net.ts").string());
  for (const auto& p : saved.named_parameters())
    if (p.name == "head.weight")
      EXPECT_GT((a.at(p.name) - p.value).abs().max().item<double>(), 1e-3);
  EXPECT_EQ(a.at("bn.running_mean").abs().sum().item<double>(), 0);
}

// In train mode BatchNorm's buffers move, rank 0's are broadcast after every step, and the run
// hands back model.ts with the trained weights and buffers.
TEST_F(TorchScriptCli, TrainsWithBatchNormAndWritesModelTs) {
  job(b_.net(32, 16, 4));
  auto r = run(krab("train job.yaml --report report.json"));
  ASSERT_EQ(r.code, 0) << r.output;
  const auto pt = load_model_pt((dir_ / "runs/job/model.pt").string());
  EXPECT_EQ(pt.at("bn.num_batches_tracked").item<int64_t>(), 10);
  EXPECT_GT(pt.at("bn.running_mean").abs().sum().item<double>(), 0);
  torch::jit::Module ts = torch::jit::load((dir_ / "runs/job/model.ts").string());
  EXPECT_FALSE(ts.is_training());
  for (const auto& p : ts.named_parameters()) EXPECT_TRUE(torch::equal(p.value, pt.at(p.name)));
  for (const auto& p : ts.named_buffers()) EXPECT_TRUE(torch::equal(p.value, pt.at(p.name)));
  // The run split the module into units (models/script_units.h) and ran rewritten methods that
  // call krab's own operator; model.ts, which Python loads, must hold none of that.
  caffe2::serialize::PyTorchStreamReader zip((dir_ / "runs/job/model.ts").string());
  for (const std::string& name : zip.getAllRecords()) {
    const auto [data, size] = zip.getRecord(name);
    EXPECT_EQ(std::string(static_cast<const char*>(data.get()), size).find("krab"),
              std::string::npos)
        << "model.ts's " << name << " mentions krab";
  }
  const auto report = nlohmann::json::parse(core::read_file((dir_ / "report.json").string()));
  EXPECT_GT(report["test_accuracy"].get<double>(), 0.3);
}

// Everything that does not need the model's structure trains it and hands back model.ts.
TEST_F(TorchScriptCli, EveryStrategyTrainsIt) {
  job(b_.net(32, 16, 4), "sync: {period: 4, servers: 1}\nfederated: {rounds: 2}\n");
  for (const std::string& how :
       {"train job.yaml --set sync.mode=local_sgd", "train job.yaml --set sync.mode=async",
        "train job.yaml --set comm.compression=powersgd --set train.optimizer.momentum=0",
        "train job.yaml --set comm.compression=topk --set comm.ratio=0.1", "fl-sim job.yaml"}) {
    fs::remove_all(dir_ / "runs");
    auto r = run(krab(how));
    ASSERT_EQ(r.code, 0) << how << "\n" << r.output;
    EXPECT_TRUE(fs::exists(dir_ / "runs/job/model.ts")) << how;
    const auto pt = load_model_pt((dir_ / "runs/job/model.pt").string());
    EXPECT_TRUE(pt.count("bn.running_mean") && pt.count("head.weight")) << how;
  }
}

// A run resumed from a checkpoint ends where the uninterrupted run ends, buffers included.
TEST_F(TorchScriptCli, ResumesWhereItStopped) {
  job(b_.net(32, 16, 4), "checkpoint: {every_steps: 5}\n");
  ASSERT_EQ(run(krab("train job.yaml --set checkpoint.dir=whole")).code, 0);
  ASSERT_EQ(run(krab("train job.yaml --set train.steps=5")).code, 0);
  auto r = run(krab("train job.yaml --set checkpoint.resume=true"));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("resumed from"), std::string::npos) << r.output;
  auto a = load_model_pt((dir_ / "runs/job/model.pt").string());
  auto b = load_model_pt((dir_ / "whole/model.pt").string());
  EXPECT_LE(max_elementwise_rel_diff(a, b), 1e-6);
  EXPECT_EQ(a.at("bn.num_batches_tracked").item<int64_t>(), 10);
}

TEST_F(TorchScriptCli, RefusesAFileThatIsNotTorchScript) {
  job(b_.net(32, 16, 4));
  write("net.ts", "PK not really a module");
  auto r = run(krab("train job.yaml"));
  // The path as krab used it: the job file's folder + model.path (docs/config.md, type path).
  expect_refused(r, 2,
                 "model.path: '" + (dir_ / "net.ts").string() + "' is not a TorchScript module");
  EXPECT_FALSE(fs::exists(dir_ / "runs"));
}

TEST_F(TorchScriptCli, RefusesOutputsThatDoNotFitTheLabels) {
  torch::jit::Module m = b_.module("Wrong");
  m.register_module("fc", b_.linear(32, 4));
  m.define(R"(
def forward(self, x):
    return self.fc.forward(x).unsqueeze(1)
)");
  job(m);
  auto r = run(krab("train job.yaml"));
  expect_refused(r, 2,
                 "forward(x) returned shape [2, 1, 4] but train.loss cross_entropy needs [2]");
  EXPECT_FALSE(fs::exists(dir_ / "runs"));
}

TEST_F(TorchScriptCli, RefusesAModuleWithNoTrainableParameters) {
  job(b_.frozen(32, 4));
  expect_refused(run(krab("train job.yaml")), 2, "has no trainable parameters");
}

TEST_F(TorchScriptCli, RefusesLabelsOutOfRangeForCrossEntropy) {
  job(b_.net(32, 16, 3));  // synthetic data has 4 classes
  expect_refused(run(krab("train job.yaml")), 2,
                 "forward(x) gives 3 classes but the data's labels go from 0 to 3");
}

TEST_F(TorchScriptCli, StopsOnANonFiniteLossNamingStepAndRank) {
  job(b_.net(32, 16, 4, R"(
def training_loss(self, x, y):
    return self.forward(x).sum() * float('nan')
)"));
  auto r = run(krab("train job.yaml"));
  expect_refused(r, 1, "the loss is nan at step 1");
  EXPECT_NE(r.output.find("rank "), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir_ / "runs/job/model.pt"));
}

// A TorchScript module's children are units (models/script_units.h), so activation
// checkpointing recomputes them; this net's batch norm updates its running statistics in its
// forward, and the recompute must neither apply that update twice nor start from the updated
// values: the trained model, buffers included, equals the run without checkpointing bit for bit.
TEST_F(TorchScriptCli, CheckpointingATorchScriptModelTrainsAsWithout) {
  job(b_.net(32, 16, 4));
  auto plain = run(krab("train job.yaml --set checkpoint.dir=plain"));
  ASSERT_EQ(plain.code, 0) << plain.output;
  auto r =
      run(krab("train job.yaml --set checkpoint.dir=ckpt --set "
               "model.activation_checkpointing=true"));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(r.output.find("has no units"), std::string::npos) << r.output;
  auto a = load_model_pt((dir_ / "plain/model.pt").string());
  auto b = load_model_pt((dir_ / "ckpt/model.pt").string());
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, t] : a) EXPECT_TRUE(torch::equal(t, b.at(name))) << name;
}

// ZeRO stage 3 on a TorchScript model: the children krab rewrote to krab::unit_call are units,
// each gathered around its call and freed after; the same model as stage 0, and model.ts too.
TEST_F(TorchScriptCli, ZeroStageThreeEndsWhereStageZeroEnds) {
  job(b_.net(32, 16, 4));
  auto base = run(krab("train job.yaml --set checkpoint.dir=s0"));
  ASSERT_EQ(base.code, 0) << base.output;
  auto r = run(
      krab("train job.yaml --report r3.json --set checkpoint.dir=s3 --set parallel.zero_stage=3"));
  ASSERT_EQ(r.code, 0) << r.output;
  auto want = load_model_pt((dir_ / "s0/model.pt").string());
  auto got = load_model_pt((dir_ / "s3/model.pt").string());
  ASSERT_EQ(got.size(), want.size());
  EXPECT_LE(max_elementwise_rel_diff(got, want), 1e-5);
  EXPECT_TRUE(fs::exists(dir_ / "s3/model.ts"));
  const auto report = nlohmann::json::parse(core::read_file((dir_ / "r3.json").string()));
  const std::set<std::string> units(report["zero"]["units"].begin(), report["zero"]["units"].end());
  EXPECT_TRUE(units.count("body") && units.count("head")) << report["zero"].dump();
}

// LibTorch 1.13 cannot autocast layer_norm of a bf16 activation with fp32 weights (design
// §12, check 6): a post-LN module fails its first bf16 step with one line naming the key, exit
// 2 (the job asks what the model cannot do), and leaves no model behind; in fp32 it trains.
TEST_F(TorchScriptCli, Bf16StopsAPostLayerNormModelNamingTrainPrecision) {
  torch::jit::Module m = b_.module("PostLn");
  m.register_module("fc", b_.linear(32, 4));
  m.register_parameter("ln_weight", torch::ones({4}).requires_grad_(true), false);
  m.register_parameter("ln_bias", torch::zeros({4}).requires_grad_(true), false);
  m.define(R"(
def forward(self, x):
    return torch.layer_norm(self.fc.forward(x), [4], self.ln_weight, self.ln_bias)
)");
  job(m);
  auto r = run(krab("train job.yaml --set train.precision=bf16"));
  expect_refused(r, 2, "train.precision: bf16: this model's forward fails under LibTorch's bf16");
  EXPECT_NE(r.output.find("expected scalar type BFloat16"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir_ / "runs/job/model.pt"));
  auto fp32 = run(krab("train job.yaml"));
  EXPECT_EQ(fp32.code, 0) << fp32.output;
}

// Python's own modules (write_mode_modules.py) through `krab train`.
class TorchScriptCliFromPython : public TorchScriptCli {
 protected:
  void SetUp() override {
    TorchScriptCli::SetUp();
    const auto made = run(std::string(KRAB_PYTHON) + " " + KRAB_SOURCE_DIR +
                          "/tests/models/write_mode_modules.py " + dir_.string());
    ASSERT_EQ(made.code, 0) << made.output;
  }
  // Trains `module` of those as net.ts.
  void use(const std::string& module) {
    fs::copy_file(dir_ / module, dir_ / "net.ts", fs::copy_options::overwrite_existing);
    write_job();
  }
};

size_t count(const std::string& haystack, const std::string& needle) {
  size_t n = 0;
  for (size_t at = haystack.find(needle); at != std::string::npos;
       at = haystack.find(needle, at + 1))
    ++n;
  return n;
}

// torch.jit.trace in train mode froze training=True into BatchNorm and Dropout: eval() could
// not reach them, and the reported accuracy would be one the module in eval mode does not
// give (on main it trained, evaluated with batch statistics and moved num_batches_tracked in
// evaluation). Refused before any worker starts, with one line naming the fix.
TEST_F(TorchScriptCliFromPython, RefusesATraceMadeInTrainMode) {
  use("train_trace.ts");
  const auto r = run(krab("train job.yaml"));
  expect_refused(r, 2,
                 "model.path: '" + (dir_ / "net.ts").string() +
                     "': bn.forward calls aten::batch_norm with training fixed to true "
                     "(torch.jit.trace of the module in train mode)");
  EXPECT_EQ(count(r.output, "\n"), 1u) << r.output;
  EXPECT_FALSE(fs::exists(dir_ / "runs"));
}

// TorchScript does not record persistent=False, so model.pt holds `scratch`, which the Python
// module's state_dict() lacks. The launcher says so once (not once per worker), naming the
// buffers, and model.pt holds exactly Python's keys and the ones named.
TEST_F(TorchScriptCliFromPython, WarnsOnceOfBuffersWhosePersistenceTheFileDoesNotRecord) {
  use("nonpersistent.ts");
  const auto r = run(krab("train job.yaml --set train.steps=2"));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(
      count(r.output, "krab: warning: model.path '" + (dir_ / "net.ts").string() +
                          "': model.pt will hold the buffers keep, scratch of your own classes"),
      1u)
      << r.output;
  std::set<std::string> want{"scratch"};
  std::ifstream keys(dir_ / "nonpersistent.keys");
  for (std::string k; std::getline(keys, k);) want.insert(k);
  std::set<std::string> got;
  for (const auto& item : load_model_pt((dir_ / "runs/job/model.pt").string()))
    got.insert(item.first);
  EXPECT_EQ(got, want);
}

// A TorchScript file is a program. The attacker's module, written by Python's torch.jit.script,
// calls torch.from_file(TARGET, shared=True) in __setstate__ (run by torch::jit::load while the
// file loads: on main this created TARGET and training went on) or in forward. Without
// model.trust_code krab reads the file's code before LibTorch loads it and refuses it with one
// line naming the file, the record inside it, the line and the operator; TARGET is not created.
class TorchScriptCliUntrusted : public TorchScriptCli,
                                public ::testing::WithParamInterface<const char*> {
 protected:
  void SetUp() override {
    TorchScriptCli::SetUp();
    target_ = dir_ / "target";
    const auto made = run(std::string(KRAB_PYTHON) + " " + KRAB_SOURCE_DIR +
                          "/tests/models/write_file_reaching_module.py " + target_.string() + " " +
                          (dir_ / "net.ts").string() + " " + GetParam());
    ASSERT_EQ(made.code, 0) << made.output;
    ASSERT_FALSE(fs::exists(target_));
    write_job();
  }
  fs::path target_;
};

TEST_P(TorchScriptCliUntrusted, IsRefusedBeforeAnythingRuns) {
  const auto r = run(krab("train job.yaml"));
  expect_refused(
      r, 2,
      "model.path: '" + (dir_ / "net.ts").string() + "': code/__torch__/payload_module.py line ");
  EXPECT_NE(r.output.find(": torch.from_file: aten::from_file maps a file into memory"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("; set model.trust_code: true to load it anyway if you vouch for the "
                          "file"),
            std::string::npos)
      << r.output;
  EXPECT_FALSE(fs::exists(target_)) << r.output;
  EXPECT_FALSE(fs::exists(dir_ / "runs"));
}

// The user vouches for the file: it loads and trains, and its effect is the user's choice.
TEST_P(TorchScriptCliUntrusted, LoadsWhenTheUserVouchesForIt) {
  const auto r = run(krab("train job.yaml --set model.trust_code=true --set train.steps=2"));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(fs::exists(target_)) << r.output;
  EXPECT_TRUE(fs::exists(dir_ / "runs/job/model.ts"));
}

INSTANTIATE_TEST_SUITE_P(WhileLoadingAndInForward, TorchScriptCliUntrusted,
                         ::testing::Values("setstate", "forward"));

}  // namespace
}  // namespace krab::cli_test
