// End to end: `krab train` at parallel.zero_stage 3 with parallel.offload: disk
// (parallel/zero/stage3_engine.h): the master shards and the optimizer state in each worker's
// offload file. The independent expectation is the same job at stage 3 with everything in RAM
// (model.pt bit-equal: the same arithmetic on the same bytes), and for checkpoints the
// uninterrupted run (resumed at stage 2 without offload, and from stage 2 back into stage 3 with
// offload, ≤ 1e-5 as every resume at another stage).
#include <nlohmann/json.hpp>

#include "cli/cli_support.h"
#include "core/fs.h"

namespace {

using namespace krab::cli_test;

nlohmann::json read_report(const fs::path& p) {
  return nlohmann::json::parse(krab::core::read_file(p.string()));
}

// gpt on two workers, built block by block straight into the offload file (sharded
// construction); once plain fp32, once with activation checkpointing and bf16 autocast. The
// report counts masters and optimizer state as offloaded, none as resident parameters, and the
// files are gone after the run.
TEST_F(Cli, ZeroStageThreeOffloadToDiskIsBitIdenticalToStageThreeInRam) {
  std::string text;
  for (int i = 0; i < 300; ++i)
    text += "line " + std::to_string(i * 7919 % 1000) + ": the quick brown fox\n";
  write("corpus.txt", text);
  write("job.yaml", R"(
model: {name: gpt, layers: 3, width: 32, heads: 4, context: 32}
data: {name: text, path: corpus.txt, batch_size: 8}
train: {steps: 4, optimizer: {name: adam, lr: 0.002}}
parallel: {workers: 2, zero_stage: 3}
comm: {timeout_s: 20}
)");
  for (const std::string extra :
       {"", " --set model.activation_checkpointing=true --set train.precision=bf16"}) {
    SCOPED_TRACE(extra);
    fs::remove_all(dir_ / "ram");
    fs::remove_all(dir_ / "disk");
    auto ram = run(krab("train job.yaml --set checkpoint.dir=ram" + extra));
    ASSERT_EQ(ram.code, 0) << ram.output;
    auto disk =
        run(krab("train job.yaml --report r.json --set checkpoint.dir=disk "
                 "--set parallel.offload=disk" +
                 extra));
    ASSERT_EQ(disk.code, 0) << disk.output;
    const auto want = load_model_pt((dir_ / "ram/model.pt").string());
    const auto got = load_model_pt((dir_ / "disk/model.pt").string());
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(max_rel_diff(got, want), 0);
    const auto report = read_report(dir_ / "r.json");
    EXPECT_EQ(report["zero"]["offload"], "disk");
    for (const auto& m : report["memory"]["ranks"]) {
      SCOPED_TRACE(m.dump());
      EXPECT_EQ(m["params_bytes"].get<int64_t>(), 0);
      EXPECT_EQ(m["optimizer_bytes"].get<int64_t>(), 0);
      // Adam: master + two moments per element of the grad shard.
      EXPECT_EQ(m["offloaded_bytes"].get<int64_t>(), 3 * m["grads_bytes"].get<int64_t>());
      EXPECT_GT(m["grads_bytes"].get<int64_t>(), 0);
    }
    EXPECT_FALSE(fs::exists(dir_ / "disk/offload"));
  }
}

// A stage-3 checkpoint with offload is the same format as without: resumed at stage 2 in RAM,
// and a stage-2 checkpoint resumed at stage 3 with offload, both end within 1e-5 of the
// uninterrupted run (same global batch).
TEST_F(Cli, ZeroStageThreeOffloadCheckpointsResumeAtStageTwoAndBack) {
  write("job.yaml", R"(
model: {name: mlp, hidden: 32}
data: {name: synthetic, synthetic_samples: 2048, batch_size: 8}
train: {steps: 20, optimizer: {name: adam, lr: 0.01}}
parallel: {workers: 2, zero_stage: 3, offload: disk}
comm: {timeout_s: 30}
)");
  auto full = run(krab("train job.yaml --set checkpoint.dir=full"));
  ASSERT_EQ(full.code, 0) << full.output;
  const auto want = load_model_pt((dir_ / "full/model.pt").string());
  struct Case {
    std::string name, first, second;
  };
  const std::vector<Case> cases = {
      {"s3off_to_s2", "", "--set parallel.zero_stage=2 --set parallel.offload=none"},
      {"s2_to_s3off", "--set parallel.zero_stage=2 --set parallel.offload=none", ""},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    auto part = run(
        krab("train job.yaml --set train.steps=10 --set checkpoint.dir=" + c.name + " " + c.first));
    ASSERT_EQ(part.code, 0) << part.output;
    ASSERT_TRUE(fs::exists(dir_ / c.name / "step-00000010/manifest.krab"));
    auto r = run(krab("train job.yaml --set checkpoint.resume=true --set checkpoint.dir=" + c.name +
                      " " + c.second));
    ASSERT_EQ(r.code, 0) << r.output;
    EXPECT_NE(r.output.find("manifest.krab at step 10"), std::string::npos) << r.output;
    EXPECT_LE(max_rel_diff(load_model_pt((dir_ / c.name / "model.pt").string()), want), 1e-5);
  }
}

}  // namespace
