// parallel.offload: disk (parallel/zero/offload.h) on ZeRO stages 1 and 2, ranks as threads of
// one process. The independent expectation is the same engine with its optimizer state in RAM:
// equal parameters bit for bit after 10 steps; the state's memory against the closed form
// Σ_u shard_numel(u) · 4 · fields; the refusals against the numbers statvfs and a file-size
// limit give.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <mutex>

#include "core/errors.h"
#include "offload_test_support.h"
#include "parallel/zero/offload.h"
#include "parallel/zero/zero_engine.h"
#include "support/gloo_ranks.h"
#include "zero_test_support.h"

namespace krab::parallel::zero {
namespace {

namespace fs = std::filesystem;

using zero_test::optimizer_of;
using zero_test::resident_kb;
using zero_test::TempDir;

std::shared_ptr<models::Model> make_mlp() { return zero_test::small_model("mlp", 5); }

std::unique_ptr<ZeroEngine> make_engine(int stage, const std::string& optimizer,
                                        const std::string& offload_dir,
                                        std::unique_ptr<comm::Communicator> g, int steps) {
  ZeroEngineOptions zo;
  zo.stage = stage;
  zo.wrap = "auto";
  zo.offload_dir = offload_dir;
  zo.data_parallel.total_steps = steps;
  zo.data_parallel.global_micro_batch = 12;
  return std::make_unique<ZeroEngine>(make_mlp(), std::move(g), zo, optimizer_of(optimizer));
}

// Runs the training loop's calls for `steps` steps; returns each rank's final parameters.
// With an offload directory `check` sees each rank's engine before it is destroyed.
std::vector<at::Tensor> train(int stage, const std::string& optimizer,
                              const std::string& offload_dir,
                              const std::function<void(ZeroEngine&)>& check = {}) {
  const int steps = 10;
  std::vector<at::Tensor> out(2);
  testing::run_gloo_ranks_owned(2, [&](int r, std::unique_ptr<comm::Communicator> g) {
    auto e = make_engine(stage, optimizer, offload_dir, std::move(g), steps);
    while (auto plan = e->next_step()) {
      e->before_backward(0, true);
      auto gen = at::detail::createCPUGenerator(1000 + 10 * plan->step + r);
      auto x = at::randn({6, 13}, gen);
      auto y = at::randint(0, 5, {6}, gen, at::kLong);
      e->model().loss(e->model().forward(x), y).backward();
      e->reduce_gradients();
      e->apply(optimizer == "sgd" ? 0.05 : 0.002);
      e->after_step(*plan);
      e->settle();
    }
    if (check) check(*e);
    std::vector<at::Tensor> flat;
    for (auto& p : e->model().parameters()) flat.push_back(p.detach().reshape({-1}).clone());
    out[r] = torch::cat(flat);
  });
  return out;
}

// The data pointers of the state tensors `o` holds.
std::vector<const void*> state_pointers(torch::optim::Optimizer& o) {
  std::vector<const void*> out;
  for (const auto& [key, state] : o.state()) {
    if (auto* a = dynamic_cast<torch::optim::AdamParamState*>(state.get())) {
      out.push_back(a->exp_avg().data_ptr());
      out.push_back(a->exp_avg_sq().data_ptr());
      if (a->max_exp_avg_sq().defined()) out.push_back(a->max_exp_avg_sq().data_ptr());
    } else if (auto* s = dynamic_cast<torch::optim::SGDParamState*>(state.get())) {
      out.push_back(s->momentum_buffer().data_ptr());
    }
  }
  return out;
}

TEST(ZeroOffload, EqualsStateInRamBitForBitAndLivesInTheMapping) {
  TempDir tmp;
  const std::string dir = (tmp.path / "offload").string();
  const std::map<std::string, int> fields = {{"adam", 2}, {"amsgrad", 3}, {"sgd", 1}};
  for (int stage : {1, 2})
    for (const auto& [optimizer, k] : fields) {
      SCOPED_TRACE("stage " + std::to_string(stage) + " " + optimizer);
      const auto want = train(stage, optimizer, "");
      std::mutex mu;
      const auto got = train(stage, optimizer, dir, [&, k = k](ZeroEngine& e) {
        std::lock_guard<std::mutex> lock(mu);
        const DiskOffload* off = e.offload();
        ASSERT_NE(off, nullptr);
        EXPECT_TRUE(fs::exists(off->path()));
        EXPECT_EQ(fs::status(off->path()).permissions() & fs::perms::all,
                  fs::perms::owner_read | fs::perms::owner_write);
        EXPECT_EQ(fs::status(dir).permissions() & fs::perms::all, fs::perms::owner_all);
        const char* begin = off->data();
        const char* end = begin + off->regions().file_bytes;
        int64_t closed_form = 0;
        int with_state = 0;
        for (int u = 0; u < e.layout().num_units(); ++u) {
          closed_form += e.layout().shard_numel(u) * 4 * k;
          auto* o = e.state().sharded->optimizers[u];
          for (const void* p : state_pointers(*o)) {
            EXPECT_GE(static_cast<const char*>(p), begin) << "unit " << u;
            EXPECT_LT(static_cast<const char*>(p), end) << "unit " << u;
          }
          with_state += e.layout().shard_numel(u) > 0 ? 1 : 0;
          EXPECT_EQ(static_cast<int>(o->state().size()), e.layout().shard_numel(u) > 0 ? 1 : 0);
        }
        EXPECT_GT(with_state, 1);  // several units: the window moves
        const auto m = e.memory();
        EXPECT_EQ(m.offloaded, closed_form);
        EXPECT_EQ(m.optimizer, 0);
        EXPECT_EQ(e.describe()["zero"]["offload"], "disk");
        // The window released every unit it stepped: none of the state is in this process.
        EXPECT_EQ(resident_kb(off->data()), 0);
      });
      for (int r = 0; r < 2; ++r) EXPECT_TRUE(torch::equal(got[r], want[r])) << "rank " << r;
      // Each rank removed its file, and the last one the directory.
      EXPECT_FALSE(fs::exists(dir));
    }
}

TEST(ZeroOffload, RegionsArePageAlignedAndHoldEveryField) {
  const auto r = plan_offload({10, 0, 3000}, {2, 2, 3}, 4096);
  EXPECT_EQ(r.offset, (std::vector<int64_t>{0, 4096, 4096}));
  EXPECT_EQ(r.bytes, (std::vector<int64_t>{80, 0, 36000}));
  EXPECT_EQ(r.file_bytes, 4096 + 9 * 4096);
  EXPECT_EQ(r.state_bytes(), 36080);
}

TEST(ZeroOffload, NotEnoughRoomIsRefusedNamingTheKeyTheDirectoryAndBothNumbers) {
  check_offload_room("runs/x/offload", 4, 1000, 4200);  // exactly 4 · 1000 · 1.05
  try {
    check_offload_room("runs/x/offload", 4, 1000, 4199);
    ADD_FAILURE() << "accepted";
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    for (const char* s : {"parallel.offload", "'runs/x/offload'", "4200 bytes", "4199 bytes free"})
      EXPECT_NE(what.find(s), std::string::npos) << what;
  }
}

// A real full file system: a tmpfs of 8 KiB (mounting needs root; skipped otherwise). Every
// rank refuses before creating anything.
TEST(ZeroOffload, AFullFileSystemIsRefusedBeforeAnyFileIsMade) {
  TempDir tmp;
  if (::mount("tmpfs", tmp.path.c_str(), "tmpfs", 0, "size=8k") != 0)
    GTEST_SKIP() << "cannot mount a tmpfs here (needs root)";
  struct Unmount {
    std::string path;
    ~Unmount() { ::umount(path.c_str()); }
  } unmount{tmp.path.string()};
  const std::string dir = (tmp.path / "offload").string();
  testing::run_gloo_ranks_owned(2, [&](int, std::unique_ptr<comm::Communicator> g) {
    try {
      make_engine(2, "adam", dir, std::move(g), 1);
      ADD_FAILURE() << "accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("parallel.offload"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(dir), std::string::npos) << e.what();
    }
  });
  EXPECT_FALSE(fs::exists(dir));
}

// posix_fallocate failing (here under a file-size limit, EFBIG) is an error naming the file,
// and the file is not left behind.
TEST(ZeroOffload, AllocationFailureNamesTheFile) {
  TempDir tmp;
  const std::string dir = (tmp.path / "offload").string();
  at::Tensor shard = torch::zeros({1 << 16});
  ShardOptimizers optimizers({shard}, optimizer_of("adam"));
  const auto regions = plan_offload({1 << 16}, {2}, 4096);
  struct rlimit old {};
  ::getrlimit(RLIMIT_FSIZE, &old);
  auto* old_handler = ::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = old;
  small.rlim_cur = 4096;
  ::setrlimit(RLIMIT_FSIZE, &small);
  try {
    DiskOffload off(dir, 3, regions, {shard}, optimizers);
    ADD_FAILURE() << "allocated past the limit";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(dir + "/rank-3.bin"), std::string::npos) << e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &old);
  ::signal(SIGXFSZ, old_handler);
  EXPECT_FALSE(fs::exists(dir + "/rank-3.bin"));
  EXPECT_TRUE(optimizers.at(0).state().empty());
}

// A file a killed run left at the path is replaced, not written through or refused.
TEST(ZeroOffload, AStaleFileIsReplaced) {
  TempDir tmp;
  const std::string dir = (tmp.path / "offload").string();
  fs::create_directories(dir);
  { std::ofstream(dir + "/rank-0.bin") << "stale"; }
  at::Tensor shard = torch::zeros({100});
  ShardOptimizers optimizers({shard}, optimizer_of("sgd"));
  {
    DiskOffload off(dir, 0, plan_offload({100}, {1}, 4096), {shard}, optimizers);
    EXPECT_EQ(fs::file_size(off.path()), 4096u);
    EXPECT_EQ(off.data()[0], 0);  // the new file's zeros, not "stale"
  }
  EXPECT_FALSE(fs::exists(dir));
}

}  // namespace
}  // namespace krab::parallel::zero
