// ZeRO stage 3 with parallel.offload: disk (stage3_engine.h, offload.h): the master shards and
// the optimizer state in the offload file, ranks as threads of one process (loopback Gloo). The
// independent expectations: stage 3 with everything in RAM (bit-equal parameters, and its
// master shards equal to what a plain read of the file finds), the closed form of the file's
// bytes, /proc/self/smaps (none of the mapping resident between steps), and the room a tmpfs of
// a chosen size has.
#include <ATen/CPUGeneratorImpl.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <mutex>

#include "core/errors.h"
#include "models/describe.h"
#include "offload_test_support.h"
#include "parallel/zero/offload.h"
#include "parallel/zero/stage3_build.h"
#include "parallel/zero/stage3_engine.h"
#include "support/gloo_ranks.h"
#include "zero_test_support.h"

namespace krab::parallel::zero {
namespace {

namespace fs = std::filesystem;

using zero_test::optimizer_of;
using zero_test::resident_kb;
using zero_test::TempDir;

// `n` floats of the file at `offset`, read with pread (not through the engine's mapping).
at::Tensor read_file(const std::string& path, int64_t offset, int64_t n) {
  at::Tensor t = torch::empty({n});
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  EXPECT_GE(fd, 0) << path;
  EXPECT_EQ(::pread(fd, t.data_ptr(), n * 4, offset), n * 4);
  ::close(fd);
  return t;
}

struct Job {
  std::string model = "mlp";
  std::string optimizer = "adam";
  bool checkpointing = false;
  std::string offload_dir;  // empty: in RAM
};

struct Outcome {
  at::Tensor params;                // whole, named_parameters order
  std::vector<at::Tensor> masters;  // the master shard of each unit, after the last step
  std::vector<at::Tensor> in_file;  // the same read from the offload file (offload only)
  engine::MemoryStats memory;
  int64_t resident_kb_max = -1;  // the mapping's resident KiB after each step (offload)
};

std::pair<at::Tensor, at::Tensor> batch(const Job& c, int64_t step, int rank) {
  auto g = at::detail::createCPUGenerator(1000 + 100 * step + rank);
  if (c.model == "gpt") {
    auto x = at::randint(0, 29, {3, 8}, g, at::kLong);
    return {x, at::randint(0, 29, {3, 8}, g, at::kLong)};
  }
  return {at::randn({6, 13}, g), at::randint(0, 5, {6}, g, at::kLong)};
}

at::Tensor whole_params(Stage3Engine& e) {
  std::vector<at::Tensor> v;
  e.visit_parameters([&](const std::string&, const at::Tensor& t) {
    v.push_back(t.detach().reshape({-1}).clone());
  });
  return torch::cat(v);
}

// 4 steps of the training loop's calls on two ranks.
std::vector<Outcome> train(const Job& c) {
  std::vector<Outcome> out(2);
  testing::run_gloo_ranks_owned(2, [&](int r, std::unique_ptr<comm::Communicator> g) {
    Stage3EngineOptions o;
    o.activation_checkpointing = c.checkpointing;
    o.offload_dir = c.offload_dir;
    o.data_parallel.total_steps = 4;
    o.data_parallel.global_micro_batch = 12;
    Stage3Engine e(zero_test::small_model(c.model, 11), std::move(g), o, optimizer_of(c.optimizer));
    Outcome& mine = out[r];
    while (auto plan = e.next_step()) {
      e.before_backward(0, true);
      auto [x, y] = batch(c, plan->step, r);
      e.model().loss(e.model().forward(x), y).backward();
      e.reduce_gradients();
      e.apply(c.optimizer == "adam" ? 0.002 : 0.05);
      e.after_step(*plan);
      e.settle();
      if (const DiskOffload* off = e.storage().offload())
        mine.resident_kb_max = std::max(mine.resident_kb_max, resident_kb(off->data()));
    }
    for (int u = 0; u < e.layout().num_units(); ++u) {
      mine.masters.push_back(e.storage().master(u).clone());
      if (const DiskOffload* off = e.storage().offload())
        mine.in_file.push_back(
            read_file(off->path(), off->regions().offset[u], e.layout().shard_numel(u)));
    }
    mine.memory = e.memory();
    if (e.storage().offload()) {
      EXPECT_EQ(e.describe()["zero"]["offload"], "disk");
      // The state a checkpoint reads is the file's.
      const auto s = e.state();
      for (int u = 0; u < e.layout().num_units(); ++u)
        EXPECT_EQ(s.sharded->values[u].data_ptr(), e.storage().offload()->master(u).data_ptr());
    }
    mine.params = whole_params(e);
  });
  return out;
}

// The masters move to the file, not the arithmetic: every parameter and every master shard
// equal to stage 3 in RAM bit for bit (Adam and SGD with momentum; mlp and gpt, gpt once with
// activation checkpointing); the file, read without the mapping, holds the masters; the report
// counts masters and optimizer state as offloaded (Σ_u S_u · 4 · (1 + fields)) and none of the
// mapping is resident between steps; the file is gone afterwards.
TEST(ZeroStage3Offload, EqualsStageThreeInRamBitForBitWithTheMastersInTheFile) {
  TempDir tmp;
  const std::string dir = (tmp.path / "offload").string();
  struct Case {
    std::string model, optimizer;
    bool checkpointing;
    int fields;
  };
  for (const Case& k : {Case{"mlp", "adam", false, 2}, Case{"mlp", "sgd", false, 1},
                        Case{"gpt", "adam", false, 2}, Case{"gpt", "sgd", true, 1}}) {
    SCOPED_TRACE(k.model + " " + k.optimizer + (k.checkpointing ? " checkpointing" : ""));
    Job c{k.model, k.optimizer, k.checkpointing, ""};
    const auto want = train(c);
    c.offload_dir = dir;
    const auto got = train(c);
    for (int r = 0; r < 2; ++r) {
      SCOPED_TRACE("rank " + std::to_string(r));
      EXPECT_TRUE(torch::equal(got[r].params, want[r].params));
      ASSERT_EQ(got[r].in_file.size(), want[r].masters.size());
      int64_t shard_bytes = 0;
      for (size_t u = 0; u < want[r].masters.size(); ++u) {
        EXPECT_TRUE(torch::equal(got[r].masters[u], want[r].masters[u])) << "unit " << u;
        EXPECT_TRUE(torch::equal(got[r].in_file[u], want[r].masters[u])) << "unit " << u;
        shard_bytes += want[r].masters[u].numel() * 4;
      }
      const auto& m = got[r].memory;
      EXPECT_EQ(m.offloaded, shard_bytes * (1 + k.fields));
      EXPECT_EQ(m.params, 0);
      EXPECT_EQ(m.optimizer, 0);
      EXPECT_EQ(m.grads, shard_bytes);
      EXPECT_EQ(want[r].memory.params, shard_bytes);
      EXPECT_EQ(want[r].memory.optimizer, shard_bytes * k.fields);
      EXPECT_EQ(got[r].resident_kb_max, 0);
    }
    EXPECT_FALSE(fs::exists(dir));
  }
}

models::ModelSpec gpt_spec() {
  models::ModelSpec s;
  s.name = "gpt";
  s.input_shape = {8};
  s.num_classes = 29;
  s.layers = 3;
  s.width = 24;
  s.heads = 2;
  s.context = 8;
  return s;
}

// Sharded construction writes each master into the file as its unit is adopted: once built,
// none of the mapping is resident, and the file (read without the mapping) holds this rank's
// shard of the parameters the engine gathers whole. A restore writes into the file: values
// written through state() reach the parameters, and the restored pages are dropped.
TEST(ZeroStage3Offload, ShardedConstructionAndRestoreGoThroughTheFile) {
  TempDir tmp;
  const std::string dir = (tmp.path / "offload").string();
  testing::run_gloo_ranks_owned(2, [&](int r, std::unique_ptr<comm::Communicator> g) {
    Stage3EngineOptions o;
    o.offload_dir = dir;
    o.data_parallel.total_steps = 1;
    o.data_parallel.global_micro_batch = 6;
    auto e = make_stage3_engine(gpt_spec(), std::move(g), o, optimizer_of("adam"));
    const DiskOffload* off = e->storage().offload();
    ASSERT_NE(off, nullptr);
    EXPECT_EQ(resident_kb(off->data()), 0);
    std::map<std::string, at::Tensor> whole;
    e->visit_parameters(
        [&](const std::string& name, const at::Tensor& t) { whole[name] = t.clone(); });
    EXPECT_EQ(resident_kb(off->data()), 0);
    const auto& layout = e->layout();
    for (int u = 0; u < layout.num_units(); ++u) {
      std::vector<at::Tensor> parts;
      for (const auto& span : layout.unit(u).params)
        parts.push_back(whole[span.name].reshape({-1}));
      at::Tensor flat = torch::zeros({layout.unit(u).padded});
      if (!parts.empty()) flat.narrow(0, 0, layout.unit(u).numel).copy_(torch::cat(parts));
      const auto range = layout.shard(u, r);
      EXPECT_TRUE(torch::equal(read_file(off->path(), off->regions().offset[u], range.size()),
                               flat.narrow(0, range.begin, range.size())))
          << "unit " << u;
    }
    // A restore: value = flat index, written through state() into the mapping.
    const auto s = e->state();
    for (int u = 0; u < layout.num_units(); ++u) {
      const auto range = layout.shard(u, r);
      s.sharded->values[u].copy_(torch::arange(range.begin, range.end, torch::kFloat));
    }
    e->after_restore();
    e->settle();
    EXPECT_EQ(resident_kb(off->data()), 0);
    e->visit_parameters([&](const std::string& name, const at::Tensor& t) {
      const auto loc = layout.locate(name);
      ASSERT_TRUE(loc.has_value()) << name;
      EXPECT_TRUE(torch::equal(t.reshape({-1}),
                               torch::arange(loc->offset, loc->offset + t.numel(), torch::kFloat)))
          << name;
    });
  });
  EXPECT_FALSE(fs::exists(dir));
}

// The room check counts the masters: on a tmpfs with room for every rank's optimizer state
// (+5%) but not for the masters beside it, stage 3 is refused on every rank before any file is
// made, naming parallel.offload and the directory (mounting needs root; skipped otherwise).
TEST(ZeroStage3Offload, AFileSystemWithoutRoomForTheMastersIsRefused) {
  TempDir tmp;
  models::ModelSpec spec;
  spec.name = "mlp";
  spec.input_shape = {13};
  spec.hidden = 600;
  spec.num_classes = 5;
  std::vector<engine::ParamShape> shapes;
  for (const auto& p : models::describe_parameters(spec).params)
    shapes.push_back({p.name, p.shape});
  Stage3EngineOptions o;
  o.data_parallel.total_steps = 1;
  o.data_parallel.global_micro_batch = 6;
  const auto layout =
      plan_stage3_layout(shapes, models::describe_parameters(spec).unit_candidates, o, 2);
  std::vector<int64_t> numel;
  for (int u = 0; u < layout.num_units(); ++u) numel.push_back(layout.shard_numel(u));
  const int64_t page = ::sysconf(_SC_PAGESIZE);
  const std::vector<int> fields(numel.size(), 1);  // SGD with momentum
  const int64_t state_only = plan_offload(numel, fields, page).file_bytes;
  const int64_t with_masters = plan_offload(numel, fields, page, true).file_bytes;
  const int64_t size = (state_only * 2 * 105 / 100 + page) / page * page;
  ASSERT_LT(size, with_masters * 2);
  const std::string options = "size=" + std::to_string(size);
  if (::mount("tmpfs", tmp.path.c_str(), "tmpfs", 0, options.c_str()) != 0)
    GTEST_SKIP() << "cannot mount a tmpfs here (needs root)";
  struct Unmount {
    std::string path;
    ~Unmount() { ::umount(path.c_str()); }
  } unmount{tmp.path.string()};
  const std::string dir = (tmp.path / "offload").string();
  // Without the masters the files would fit: the refusal below is the masters'.
  check_offload_room(dir, 2, state_only, available_bytes(dir));
  o.offload_dir = dir;
  testing::run_gloo_ranks_owned(2, [&](int, std::unique_ptr<comm::Communicator> g) {
    try {
      make_stage3_engine(spec, std::move(g), o, optimizer_of("sgd"));
      ADD_FAILURE() << "accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("parallel.offload"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(dir), std::string::npos) << e.what();
    }
  });
  EXPECT_FALSE(fs::exists(dir));
}

}  // namespace
}  // namespace krab::parallel::zero
