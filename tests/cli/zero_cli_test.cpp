// End-to-end: `krab train` with parallel.zero_stage 1 and 2 (parallel/zero/zero_engine.h)
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
// all-reduce), so the contract is "up to reduction order": <= 1e-5.
TEST_F(Cli, ZeroStagesOneAndTwoEndWhereStageZeroEnds) {
  write("job.yaml", R"(
model: {name: cnn}
data: {name: fashion-mnist, batch_size: 16}
train: {steps: 6, optimizer: {name: sgd, lr: 0.05, momentum: 0.9}}
parallel: {workers: 4, bucket_mb: 0.5}
)");
  auto base = run(krab("train job.yaml --report r0.json --set checkpoint.dir=s0"));
  ASSERT_EQ(base.code, 0) << base.output;
  const auto want = load_model_pt((dir_ / "s0/model.pt").string());
  for (int stage : {1, 2}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    const std::string s = std::to_string(stage);
    auto r = run(krab("train job.yaml --report r" + s + ".json --set checkpoint.dir=s" + s +
                      " --set parallel.zero_stage=" + s));
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
    EXPECT_EQ(ops["reduce_scatter"], ops["allgather"]);
  }
}

// Disk offload changes where the optimizer state lives, not what it computes: bit-equal
// model.pt, and the offload files are gone once the run ends.
TEST_F(Cli, ZeroOffloadToDiskEndsWhereStageTwoEnds) {
  write("job.yaml", R"(
model: {name: cnn}
data: {name: fashion-mnist, batch_size: 16}
train: {steps: 4, optimizer: {name: adam, lr: 0.002}}
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
  expect_refused(train("--set parallel.zero_stage=3"), 2, "stage 3 is not built yet");
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
                 "parallel.offload: disk needs parallel.zero_stage 1 or 2");
}

}  // namespace
