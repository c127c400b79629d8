// End-to-end: `krab train` with parallel.zero_stage 1 to 3 (parallel/zero/zero_engine.h,
// stage3_engine.h)
// against stage 0 on the same job — the determinism contract across stages — and the
// refusals of the zero keys, each naming its keys.
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <torch/torch.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "cli/cli_support.h"

namespace {

using namespace krab::cli_test;

nlohmann::json read_json(const fs::path& p) {
  std::ifstream in(p);
  return nlohmann::json::parse(in);
}

// Four workers (W >= 3: the reduce-scatter adds ranks in another order than the ring
// all-reduce), so the contract is "up to reduction order": <= 1e-5. Stage 3 gathers every unit
// for its forward and again for its backward (but the last): about 1.5 all-reduces' bytes.
TEST_F(Cli, ZeroStagesOneToThreeEndWhereStageZeroEnds) {
  write("job.yaml", R"(
model: {name: cnn}
data: {name: fashion-mnist, batch_size: 16}
train: {steps: 6, eval_examples: 500, optimizer: {name: sgd, lr: 0.05, momentum: 0.9}}
parallel: {workers: 4, bucket_mb: 0.5}
)");
  auto base = run(krab("train job.yaml --report r0.json --set checkpoint.dir=s0"));
  ASSERT_EQ(base.code, 0) << base.output;
  const auto want = load_model_pt((dir_ / "s0/model.pt").string());
  const double allreduce = read_json(dir_ / "r0.json")["bytes_sent_by_op"]["allreduce"];
  // Stage 2 runs with activation checkpointing: the engine's one unit runner waits each unit's
  // gather and recomputes it (the trainer installs none of its own).
  for (int stage : {1, 2, 3}) {
    const bool recompute = stage == 2;
    SCOPED_TRACE("stage " + std::to_string(stage) + (recompute ? " checkpointing" : ""));
    const std::string s = std::to_string(stage);
    auto r = run(krab("train job.yaml --report r" + s + ".json --set checkpoint.dir=s" + s +
                      " --set parallel.zero_stage=" + std::to_string(stage) +
                      " --set model.activation_checkpointing=" + (recompute ? "true" : "false")));
    ASSERT_EQ(r.code, 0) << r.output;
    const auto got = load_model_pt((dir_ / ("s" + s) / "model.pt").string());
    ASSERT_TRUE(got.count("conv1.weight"));
    EXPECT_LE(max_rel_diff(got, want), 1e-5);
    const auto report = read_json(dir_ / ("r" + s + ".json"));
    EXPECT_EQ(report["zero"]["stage"], stage);
    EXPECT_EQ(report["zero"]["units"], nlohmann::json::array({"", "conv1", "conv2", "fc1", "fc2"}));
    // Reduce-scatter and all-gather instead of all-reduce, equal bytes each (design §2.3).
    const auto& ops = report["bytes_sent_by_op"];
    EXPECT_EQ(ops["allreduce"].get<double>(), 0);
    EXPECT_GT(ops["reduce_scatter"].get<double>(), 0);
    if (stage < 3) {
      EXPECT_EQ(ops["reduce_scatter"], ops["allgather"]);
      EXPECT_EQ(report["zero"]["wrap"], "auto: the model's units");
      EXPECT_EQ(report["zero"]["gather_wait"], "per unit, at its forward");
      EXPECT_EQ(report["zero"]["recompute"], recompute);
      continue;
    }
    // fc2, the last unit, is gathered once: a little under 1.5 (padding adds a little).
    const double sent = ops["reduce_scatter"].get<double>() + ops["allgather"].get<double>();
    EXPECT_NEAR(sent / allreduce, 1.5, 0.01);
    EXPECT_EQ(report["zero"]["prefetch"], 1);
  }
}

// Stage 3 on gpt in the real workers: each builds the model block by block, sharding every block
// as soon as it is initialised (parallel/zero/stage3_build.h), gathers each block around its
// forward and its backward and, with activation checkpointing, recomputes it inside its backward
// gather. Two workers: the same bits as stage 0 (design §1.5).
TEST_F(Cli, ZeroStageThreeGptWithCheckpointingIsBitIdenticalToStageZero) {
  std::string text;
  for (int i = 0; i < 400; ++i)
    text += "line " + std::to_string(i * 7919 % 1000) + ": the quick brown fox " +
            std::string(1 + i % 5, "jumps"[i % 5]) + "\n";
  write("corpus.txt", text);
  write("job.yaml", R"(
model: {name: gpt, layers: 3, width: 32, heads: 4, context: 32}
data: {name: text, path: corpus.txt, batch_size: 8}
train: {steps: 6, optimizer: {name: adam, lr: 0.002}}
parallel: {workers: 2}
comm: {timeout_s: 20}
)");
  auto base = run(krab("train job.yaml --set checkpoint.dir=s0"));
  ASSERT_EQ(base.code, 0) << base.output;
  auto r = run(
      krab("train job.yaml --report r3.json --set checkpoint.dir=s3 --set parallel.zero_stage=3 "
           "--set model.activation_checkpointing=true"));
  ASSERT_EQ(r.code, 0) << r.output;
  const auto want = load_model_pt((dir_ / "s0/model.pt").string());
  const auto got = load_model_pt((dir_ / "s3/model.pt").string());
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [name, t] : want) EXPECT_TRUE(torch::equal(got.at(name), t)) << name;
  const auto report = read_json(dir_ / "r3.json");
  EXPECT_EQ(report["zero"]["units"],
            nlohmann::json::array({"", "blocks.0", "blocks.1", "blocks.2"}));
  EXPECT_EQ(report["zero"]["activation_checkpointing"], true);
}

// Disk offload changes where the optimizer state lives, not what it computes: bit-equal
// model.pt, and the offload files are gone once the run ends.
TEST_F(Cli, ZeroOffloadToDiskEndsWhereStageTwoEnds) {
  write("job.yaml", R"(
model: {name: cnn}
data: {name: fashion-mnist, batch_size: 16}
train: {steps: 4, eval_examples: 500, optimizer: {name: adam, lr: 0.002}}
parallel: {workers: 2, zero_stage: 2}
)");
  auto base = run(krab("train job.yaml --set checkpoint.dir=s0"));
  ASSERT_EQ(base.code, 0) << base.output;
  auto off =
      run(krab("train job.yaml --report r.json --set checkpoint.dir=s1 "
               "--set parallel.offload=disk"));
  ASSERT_EQ(off.code, 0) << off.output;
  const auto want = load_model_pt((dir_ / "s0/model.pt").string());
  const auto got = load_model_pt((dir_ / "s1/model.pt").string());
  ASSERT_TRUE(got.count("conv1.weight"));
  EXPECT_EQ(max_rel_diff(got, want), 0);
  EXPECT_EQ(read_json(dir_ / "r.json")["zero"]["offload"], "disk");
  EXPECT_FALSE(fs::exists(dir_ / "s1/offload"));
}

// A file system without room for the offload files (a tmpfs of 8 KiB; mounting needs root):
// the launcher refuses before spawning a worker, naming the key and the directory.
TEST_F(Cli, ZeroOffloadWithoutRoomIsRefusedBeforeTraining) {
  write("job.yaml", kSmallJob);
  const fs::path full = dir_ / "full";
  fs::create_directories(full);
  if (::mount("tmpfs", full.c_str(), "tmpfs", 0, "size=8k") != 0)
    GTEST_SKIP() << "cannot mount a tmpfs here (needs root)";
  struct Unmount {
    std::string path;
    ~Unmount() { ::umount(path.c_str()); }
  } unmount{full.string()};
  auto r =
      run(krab("train job.yaml --set checkpoint.dir=full --set parallel.zero_stage=1 "
               "--set parallel.offload=disk"));
  expect_refused(r, 2, "parallel.offload: disk needs");
  EXPECT_NE(r.output.find("full/offload"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("bytes free"), std::string::npos) << r.output;
  EXPECT_TRUE(fs::is_empty(full));
}

TEST_F(Cli, ZeroKeysAreRefusedByName) {
  write("job.yaml", kSmallJob);
  const auto train = [&](const std::string& sets) { return run(krab("train job.yaml " + sets)); };
  expect_refused(train("--set parallel.zero_stage=3 --set parallel.wrap=[fc1.weight]"), 2,
                 "parallel.wrap: 'fc1.weight' matches no module; the candidates are: ");
  expect_refused(train("--set parallel.zero_stage=1 --set sync.mode=local_sgd"), 2,
                 "parallel.zero_stage 1 needs sync.mode: sync");
  expect_refused(train("--set parallel.zero_stage=1 --set sync.mode=async --set sync.servers=1"), 2,
                 "parallel.zero_stage 1 needs sync.mode: sync");
  expect_refused(train("--set parallel.zero_stage=2 --set comm.compression=fp16 "
                       "--set comm.clip_norm=1"),
                 2, "parallel.zero_stage 2 cannot be combined with comm.clip_norm");
  expect_refused(train("--set parallel.zero_stage=1 --set comm.compression=topk"), 2,
                 "parallel.zero_stage 1 cannot be combined with comm.compression: topk");
  expect_refused(train("--set parallel.zero_stage=2 --set parallel.wrap=[fc*,nothing]"), 2,
                 "parallel.wrap: 'nothing' matches no module");
  expect_refused(train("--set parallel.offload=disk"), 2,
                 "parallel.offload: disk needs parallel.zero_stage 1, 2 or 3");
}

// A sharded checkpoint resumes at another world size and another stage (issue 26,
// "Checkpoints"): 10 steps at stage 2 on 4 workers, then the other 10 at 2 workers (stage 1),
// at 1 worker (stage 0: one process reads every shard), at 2 workers with the optimizer
// state offloaded to disk and at 2 workers at stage 3; and 10 steps at stage 3 on 4 workers,
// then the other 10 at 1 worker, stage 0 — each with the same global batch — end within 1e-5
// of the uninterrupted 20-step stage-2 run on 4 workers. A damaged shard is refused naming it.
TEST_F(Cli, ZeroResumesAtAnotherWorldSizeAndStageWhereTheUninterruptedRunEnds) {
  write("job.yaml", R"(
model: {name: mlp, hidden: 32}
data: {name: synthetic, synthetic_samples: 2048, batch_size: 8}
train: {steps: 20, optimizer: {name: adam, lr: 0.01}}
parallel: {workers: 4, zero_stage: 2, bucket_mb: 0.01}
comm: {timeout_s: 30}
)");
  auto full = run(krab("train job.yaml --set checkpoint.dir=full"));
  ASSERT_EQ(full.code, 0) << full.output;
  const auto want = load_model_pt((dir_ / "full/model.pt").string());
  auto part = run(krab("train job.yaml --set checkpoint.dir=part --set train.steps=10"));
  ASSERT_EQ(part.code, 0) << part.output;
  ASSERT_TRUE(fs::exists(dir_ / "part/step-00000010/manifest.krab"));
  ASSERT_TRUE(fs::exists(dir_ / "part/step-00000010/shard-00003-of-00004.krab"));
  struct Case {
    std::string name, sets;
  };
  const std::vector<Case> cases = {
      {"w2s1", "--set parallel.workers=2 --set data.batch_size=16 --set parallel.zero_stage=1"},
      {"w1s0", "--set parallel.workers=1 --set data.batch_size=32 --set parallel.zero_stage=0"},
      {"w2off", "--set parallel.workers=2 --set data.batch_size=16 --set parallel.offload=disk"},
      {"w2s3", "--set parallel.workers=2 --set data.batch_size=16 --set parallel.zero_stage=3"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    fs::copy(dir_ / "part", dir_ / c.name, fs::copy_options::recursive);
    auto r = run(krab("train job.yaml --set checkpoint.resume=true --set checkpoint.dir=" + c.name +
                      " " + c.sets));
    ASSERT_EQ(r.code, 0) << r.output;
    EXPECT_NE(r.output.find("manifest.krab at step 10"), std::string::npos) << r.output;
    EXPECT_LE(max_rel_diff(load_model_pt((dir_ / c.name / "model.pt").string()), want), 1e-5);
  }
  auto part3 =
      run(krab("train job.yaml --set checkpoint.dir=s3w1s0 --set train.steps=10 --set "
               "parallel.zero_stage=3"));
  ASSERT_EQ(part3.code, 0) << part3.output;
  auto r =
      run(krab("train job.yaml --set checkpoint.resume=true --set checkpoint.dir=s3w1s0 "
               "--set parallel.workers=1 --set data.batch_size=32 --set parallel.zero_stage=0"));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("manifest.krab at step 10"), std::string::npos) << r.output;
  EXPECT_LE(max_rel_diff(load_model_pt((dir_ / "s3w1s0/model.pt").string()), want), 1e-5);
  fs::copy(dir_ / "part", dir_ / "bad", fs::copy_options::recursive);
  fs::remove(dir_ / "bad/model.pt");  // the 10-step run's; a refused resume must write none
  {
    std::fstream f(dir_ / "bad/step-00000010/shard-00002-of-00004.krab",
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put('\x5a');
  }
  expect_refused(run(krab("train job.yaml --set checkpoint.resume=true --set checkpoint.dir=bad "
                          "--set parallel.workers=2 --set data.batch_size=16")),
                 2, "shard-00002-of-00004.krab");
  EXPECT_FALSE(fs::exists(dir_ / "bad/model.pt"));
}

}  // namespace
