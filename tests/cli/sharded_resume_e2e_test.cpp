// `krab train` resuming a sharded checkpoint (a manifest and shards) as a full replica (stage
// 0), end to end: the shards are cut here from the state.krab of a real 10-step run, so the
// resumed run must end exactly (bitwise) where the uninterrupted 20-step run ends; a damaged
// shard is refused before any worker starts, exit 2, naming the shard. (Resuming at another
// stage needs the ZeRO engine: docs/design/zero-sharding.md §8, P5.)
#include <ATen/CPUGeneratorImpl.h>

#include <fstream>

#include "cli_support.h"
#include "core/errors.h"
#include "core/fs.h"
#include "engine/sharded_state.h"
#include "models/model.h"
#include "support/gloo_ranks.h"
#include "train/checkpoint.h"
#include "train/manifest.h"
#include "train/sharded_checkpoint.h"

namespace krab::cli_test {
namespace {

// No parameters or buffers of its own: every parameter of the checkpoint is in a unit.
struct Empty : models::Model {
  at::Tensor forward(const at::Tensor& x) override { return x; }
};

// Rewrites `state_krab` (an SGD run's) as a sharded checkpoint of `world` ranks in `run_dir`:
// one root unit holding every parameter, alignment 4, each rank's slice of the values and of
// the momentum buffers cut from the concatenated parameters.
void shard_checkpoint(const std::string& state_krab, const std::string& run_dir, int world) {
  const core::Record in = train::parse_checkpoint(core::read_file(state_krab), state_krab);
  const train::CheckpointMeta meta = train::read_meta(in);
  engine::UnitParams root;
  std::vector<at::Tensor> values, momenta;
  for (const auto& p : train::parse_param_list(meta.signature, state_krab, "signature")) {
    root.params.push_back(p);
    values.push_back(in.tensor("param." + p.name).reshape(-1));
    momenta.push_back(
        in.tensor(str_cat("optimizer.state.", momenta.size(), ".momentum_buffer")).reshape(-1));
  }
  const engine::ShardLayout layout = engine::plan_layout({root}, world, 4);
  const int64_t pad = layout.unit(0).padded - layout.unit(0).numel, s = layout.shard_numel(0);
  const at::Tensor flat = torch::cat({torch::cat(values), torch::zeros({pad})});
  const at::Tensor flat_m = torch::cat({torch::cat(momenta), torch::zeros({pad})});
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  gen.set_state(in.tensor("rng"));  // shard 0 carries this process's generator
  testing::run_gloo_ranks(world, [&](int r, comm::Communicator& comm) {
    at::Tensor v = flat.narrow(0, r * s, s).clone();
    torch::optim::SGD opt({v}, torch::optim::SGDOptions(in.real("optimizer.group.0.lr"))
                                   .momentum(in.real("optimizer.group.0.momentum"))
                                   .dampening(in.real("optimizer.group.0.dampening"))
                                   .weight_decay(in.real("optimizer.group.0.weight_decay"))
                                   .nesterov(in.real("optimizer.group.0.nesterov") != 0));
    auto st = std::make_unique<torch::optim::SGDParamState>();
    st->momentum_buffer(flat_m.narrow(0, r * s, s).clone());
    opt.state()[c10::guts::to_string(v.unsafeGetTensorImpl())] = std::move(st);
    Empty model;
    engine::ShardedState sharded{&layout, 2, {v}, {&opt}};
    train::save_sharded_checkpoint(comm, run_dir, meta, {&model, nullptr, r, world, &sharded}, {},
                                   3);
  });
}

TEST_F(Cli, AStageZeroRunResumesAShardedCheckpointWhereTheUninterruptedRunEnds) {
  write("job.yaml", kSmallJob);
  auto full = run(krab("train job.yaml --set checkpoint.dir=full"));
  ASSERT_EQ(full.code, 0) << full.output;
  auto first = run(krab("train job.yaml --set checkpoint.dir=part --set train.steps=10"));
  ASSERT_EQ(first.code, 0) << first.output;
  shard_checkpoint((dir_ / "part/step-00000010/state.krab").string(), (dir_ / "sharded").string(),
                   3);
  ASSERT_TRUE(fs::exists(dir_ / "sharded/step-00000010/manifest.krab"));
  auto second =
      run(krab("train job.yaml --set checkpoint.dir=sharded --set checkpoint.resume=true"));
  ASSERT_EQ(second.code, 0) << second.output;
  EXPECT_NE(second.output.find("manifest.krab at step 10"), std::string::npos) << second.output;
  EXPECT_EQ(max_rel_diff(load_model_pt((dir_ / "full/model.pt").string()),
                         load_model_pt((dir_ / "sharded/model.pt").string())),
            0.0);
  // The resumed run's own final checkpoint is a state.krab again (stage 0 writes that).
  EXPECT_TRUE(fs::exists(dir_ / "sharded/step-00000020/state.krab"));

  shard_checkpoint((dir_ / "part/step-00000010/state.krab").string(), (dir_ / "bad").string(), 3);
  {
    std::fstream f(dir_ / "bad/step-00000010/shard-00001-of-00003.krab",
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(64);
    f.put('\x5a');
  }
  expect_refused(run(krab("train job.yaml --set checkpoint.dir=bad --set checkpoint.resume=true")),
                 2, "shard-00001-of-00003.krab");
  EXPECT_FALSE(fs::exists(dir_ / "bad/model.pt"));
}

}  // namespace
}  // namespace krab::cli_test
