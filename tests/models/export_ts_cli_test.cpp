// `krab export` of a TorchScript run (train/model_export.h, models/script_file.h): model.ts
// written from a sharded checkpoint holds exactly the run's own end-of-run model.ts weights,
// loads with torch::jit::load and with Python's torch.jit.load, and calls no krab operator;
// bad input is refused with exit 2 naming the run directory, the step or the model file.
#include <caffe2/serialize/inline_container.h>
#include <torch/script.h>
#include <torch/torch.h>

#include "cli/cli_support.h"
#include "support/script_modules.h"

namespace krab::cli_test {
namespace {

class ExportTs : public Cli {
 protected:
  // Trains net.ts (a BatchNorm net) for 4 steps into run directory `run` with `sets`.
  Result train(const std::string& run, const std::string& sets) {
    return cli_test::run(krab("train job.yaml --set checkpoint.dir=" + run + " " + sets));
  }
  void SetUp() override {
    Cli::SetUp();
    b_.net(32, 16, 4).save((dir_ / "net.ts").string());
    write("job.yaml", R"(
model: {name: torchscript, path: net.ts}
data: {name: synthetic, synthetic_samples: 512, synthetic_features: 32, batch_size: 16}
train: {steps: 4, optimizer: {name: adam, lr: 0.01}}
comm: {timeout_s: 20}
)");
  }
  // Parameters and buffers of two model.ts files are the same bits; their outputs too.
  void expect_same_module(const fs::path& a, const fs::path& b) {
    torch::jit::Module x = torch::jit::load(a.string()), y = torch::jit::load(b.string());
    EXPECT_FALSE(x.is_training());
    std::map<std::string, at::Tensor> want;
    for (const auto& p : y.named_parameters()) want[p.name] = p.value;
    for (const auto& p : y.named_buffers()) want[p.name] = p.value;
    size_t n = 0;
    for (const auto& p : x.named_parameters()) {
      ++n;
      EXPECT_TRUE(want.count(p.name) && torch::equal(p.value, want.at(p.name))) << p.name;
    }
    for (const auto& p : x.named_buffers()) {
      ++n;
      EXPECT_TRUE(want.count(p.name) && torch::equal(p.value, want.at(p.name))) << p.name;
    }
    EXPECT_EQ(n, want.size());
    const at::Tensor in = torch::randn({3, 32});
    EXPECT_TRUE(torch::equal(x.forward({in}).toTensor(), y.forward({in}).toTensor()));
  }
  test::ScriptBuilder b_;
};

// Stage 1 on 2 workers and stage 2 on 4: the final checkpoint is sharded (a manifest and one
// shard per rank); export's model.ts equals the run's own bit for bit, moved away from the
// untrained file, with no krab operator in it, and Python loads and runs it.
TEST_F(ExportTs, ModelTsFromAShardedCheckpointIsTheRunsOwn) {
  for (const auto& [stage, workers] : {std::pair{1, 2}, std::pair{2, 4}}) {
    const std::string run = "s" + std::to_string(stage);
    SCOPED_TRACE(run);
    const Result r = train(run, "--set parallel.zero_stage=" + std::to_string(stage) +
                                    " --set parallel.workers=" + std::to_string(workers));
    ASSERT_EQ(r.code, 0) << r.output;
    ASSERT_TRUE(fs::exists(dir_ / run / "step-00000004/manifest.krab"));
    const Result e = cli_test::run(krab("export " + run + " --out " + run + "/exported.pt"));
    ASSERT_EQ(e.code, 0) << e.output;
    EXPECT_NE(e.output.find(run + "/exported.ts"), std::string::npos) << e.output;
    expect_same_module(dir_ / run / "exported.ts", dir_ / run / "model.ts");
    const auto head = [](const fs::path& p) {
      return torch::jit::load(p.string()).attr("head").toModule().attr("weight").toTensor();
    };
    EXPECT_FALSE(torch::equal(head(dir_ / run / "exported.ts"), head(dir_ / "net.ts")));
    caffe2::serialize::PyTorchStreamReader zip((dir_ / run / "exported.ts").string());
    for (const std::string& name : zip.getAllRecords()) {
      const auto [data, size] = zip.getRecord(name);
      EXPECT_EQ(std::string(static_cast<const char*>(data.get()), size).find("krab"),
                std::string::npos)
          << name;
    }
  }
  const Result py =
      cli_test::run(std::string(KRAB_PYTHON) + " -c \"import torch; m = torch.jit.load('" +
                    (dir_ / "s2/exported.ts").string() +
                    "'); print('shape', tuple(m(torch.randn(5, 32)).shape))\"");
  ASSERT_EQ(py.code, 0) << py.output;
  EXPECT_NE(py.output.find("shape (5, 4)"), std::string::npos) << py.output;
}

// Nothing to export, a step that does not exist, and a model file changed since the run (its
// SHA-256 is not the one the checkpoint records): exit 2 naming each, and nothing written.
TEST_F(ExportTs, RefusesAMissingCheckpointOrStepAndAChangedModelFile) {
  fs::create_directories(dir_ / "empty");
  expect_refused(cli_test::run(krab("export empty")), 2, "'empty' has no checkpoint");
  const Result r = train("run", "--set parallel.zero_stage=2 --set parallel.workers=2");
  ASSERT_EQ(r.code, 0) << r.output;
  expect_refused(cli_test::run(krab("export run --step 3")), 2, "--step 3");
  b_.net(32, 16, 4).save((dir_ / "net.ts").string());  // the same shapes, other weights
  const Result changed = cli_test::run(krab("export run --out run/exported.pt"));
  expect_refused(changed, 2, "'" + (dir_ / "net.ts").string() + "' changed since the run");
  EXPECT_FALSE(fs::exists(dir_ / "run/exported.pt"));
  EXPECT_FALSE(fs::exists(dir_ / "run/exported.ts"));
  fs::remove(dir_ / "net.ts");
  expect_refused(cli_test::run(krab("export run --out run/exported.pt")), 2,
                 "'" + (dir_ / "net.ts").string() + "' is missing");
}

}  // namespace
}  // namespace krab::cli_test
