// data.name: tensors through the krab binary: shards written by Python train on 2 workers
// exactly as on 1 worker with the doubled batch (the determinism contract, with the sampler's
// shard windows and a cache a third of the data set), a test split read lazily from shards gives
// the accuracy of the same split in memory, and a bad tensor file stops the job before any
// worker starts.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <nlohmann/json.hpp>

#include "cli/cli_support.h"
#include "core/fs.h"

namespace {

using namespace krab::cli_test;

// 12 shards of 256 examples x 256 float32 features (258 KiB each with their labels): 3 MiB,
// three times data.cache_mb 1, whose window holds 3 shards. Labels are a linear function of x
// so that the MLP learns something; the test split is one more file.
const char* kWriteShards = R"PY(
import os, sys, torch
d = sys.argv[1]
os.makedirs(os.path.join(d, "shards"))
g = torch.Generator().manual_seed(0)
w = torch.randn(256, 4, generator=g)
def part(n):
    x = torch.randn(n, 256, generator=g)
    return {"x": x, "y": (x @ w).argmax(1)}
for i in range(12):
    torch.save(part(256), os.path.join(d, "shards", "train-%02d.pt" % i))
test = part(512)
torch.save(test, os.path.join(d, "test.pt"))
# The same test split as a directory of two shards, which a worker reads lazily.
os.makedirs(os.path.join(d, "test_shards"))
for i in range(2):
    torch.save({k: v[i * 256:(i + 1) * 256] for k, v in test.items()},
               os.path.join(d, "test_shards", "test-%d.pt" % i))
# A scripted model with 3 outputs, one fewer than the shards' classes.
torch.jit.script(torch.nn.Linear(256, 3)).save(os.path.join(d, "three.ts"))
bad = part(10)
bad["y"] = bad["y"][:9]
torch.save(bad, os.path.join(d, "bad.pt"))
)PY";

const char* kJob = R"(
model: {name: mlp, hidden: 32}
data: {name: tensors, path: shards, test_path: test.pt, batch_size: 16, cache_mb: 1}
train: {steps: 30, optimizer: {name: sgd, lr: 0.05, momentum: 0.9}}
parallel: {workers: 2}
comm: {timeout_s: 30}
)";

TEST_F(Cli, TensorShardsTrainOnTwoWorkersAsOnOne) {
  write("write.py", kWriteShards);
  ASSERT_EQ(
      run(std::string(KRAB_PYTHON) + " " + (dir_ / "write.py").string() + " " + dir_.string()).code,
      0);
  write("job.yaml", kJob);
  auto two = run(krab("train job.yaml --set checkpoint.dir=w2 --report w2.json"));
  ASSERT_EQ(two.code, 0) << two.output;
  auto one =
      run(krab("train job.yaml --set checkpoint.dir=w1 --set parallel.workers=1 "
               "--set data.batch_size=32"));
  ASSERT_EQ(one.code, 0) << one.output;
  const auto a = load_model_pt((dir_ / "w2/model.pt").string());
  const auto b = load_model_pt((dir_ / "w1/model.pt").string());
  ASSERT_FALSE(a.empty());
  EXPECT_LE(max_rel_diff(a, b), 1e-5);
  // Training moved the parameters: the comparison is not vacuous.
  auto still =
      run(krab("train job.yaml --set checkpoint.dir=w0 --set parallel.workers=1 "
               "--set data.batch_size=32 --set train.optimizer.lr=0"));
  ASSERT_EQ(still.code, 0) << still.output;
  EXPECT_GT(max_rel_diff(a, load_model_pt((dir_ / "w0/model.pt").string())), 1e-3);
  const auto report = nlohmann::json::parse(krab::core::read_file((dir_ / "w2.json").string()));
  EXPECT_GT(report["test_accuracy"].get<double>(), 0.3);  // 4 classes: chance is 0.25
  // The test split as a directory of shards, read a batch at a time at evaluation: the same
  // training (the test split does not touch it), the same accuracy to the last digit.
  auto sharded_test =
      run(krab("train job.yaml --set checkpoint.dir=w2s --set data.test_path=test_shards --report "
               "w2s.json"));
  ASSERT_EQ(sharded_test.code, 0) << sharded_test.output;
  const auto lazy = nlohmann::json::parse(krab::core::read_file((dir_ / "w2s.json").string()));
  EXPECT_EQ(lazy["test_accuracy"].get<double>(), report["test_accuracy"].get<double>());
  EXPECT_EQ(lazy["final_loss"].get<double>(), report["final_loss"].get<double>());
}

TEST_F(Cli, TensorFileOfUnequalLengthsIsRefusedBeforeTraining) {
  write("write.py", kWriteShards);
  ASSERT_EQ(
      run(std::string(KRAB_PYTHON) + " " + (dir_ / "write.py").string() + " " + dir_.string()).code,
      0);
  write("job.yaml", kJob);
  const Result r = run(krab("train job.yaml --set data.path=bad.pt"));
  expect_refused(r, 2, "bad.pt: x has 10 examples but y has 9");
  EXPECT_EQ(r.output.find("rank"), std::string::npos) << r.output;  // no worker started
}

// The preflight's check of a TorchScript model against the labels sees every label of a data
// set read lazily from shards, though it holds none of them in memory.
TEST_F(Cli, TorchScriptModelWithTooFewOutputsForTheShardsIsRefused) {
  write("write.py", kWriteShards);
  ASSERT_EQ(
      run(std::string(KRAB_PYTHON) + " " + (dir_ / "write.py").string() + " " + dir_.string()).code,
      0);
  write("job.yaml", kJob);
  const Result r =
      run(krab("train job.yaml --set model.name=torchscript --set model.path=three.ts "
               "--set data.test_path="));
  expect_refused(r, 2, "gives 3 classes but the data's labels go from 0 to 3");
}

}  // namespace
