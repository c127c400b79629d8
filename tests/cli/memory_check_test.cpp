// The launcher's memory budget and its refusal of a job that does not fit (cli/resources.h):
// the cgroup limit read from a fake /proc/self/cgroup and cgroup tree (v1 and v2), the budget as
// the smaller of MemAvailable and that limit, and a refusal that names the bytes per worker and
// the cheapest setting that would fit, checked against predict_memory's own numbers.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "cli/resources.h"
#include "core/errors.h"

namespace krab::cli {
namespace {

namespace fs = std::filesystem;
namespace zero = parallel::zero;

constexpr int64_t kGiB = int64_t{1} << 30;

class FakeSystem : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("krab_memory_check_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_);
    sources_.meminfo = (root_ / "meminfo").string();
    sources_.self_cgroup = (root_ / "cgroup").string();
    sources_.cgroup_root = (root_ / "sys").string();
    sources_.self_status = (root_ / "status").string();  // none: a launcher of 0 bytes
  }
  void TearDown() override { fs::remove_all(root_); }

  void write(const std::string& rel, const std::string& text) {
    const fs::path p = root_ / rel;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
  }

  fs::path root_;
  MemorySources sources_;
};

TEST_F(FakeSystem, CgroupV1LimitIsTheSmallestOverTheCgroupAndItsAncestors) {
  write("cgroup", "9:name=systemd:/\n4:memory:/jobs/w1\n0::/\n");
  write("sys/memory/memory.limit_in_bytes", "9223372036854771712\n");  // v1's "unlimited"
  write("sys/memory/jobs/memory.limit_in_bytes", std::to_string(3 * kGiB) + "\n");
  write("sys/memory/jobs/w1/memory.limit_in_bytes", std::to_string(5 * kGiB) + "\n");
  std::string file;
  EXPECT_EQ(cgroup_memory_limit(sources_, &file), 3 * kGiB);
  EXPECT_EQ(file, (root_ / "sys/memory/jobs/memory.limit_in_bytes").string());
  write("sys/memory/jobs/memory.limit_in_bytes", "9223372036854771712\n");
  EXPECT_EQ(cgroup_memory_limit(sources_, &file), 5 * kGiB);
}

TEST_F(FakeSystem, CgroupV2MaxAndMissingFilesAreNoLimit) {
  write("cgroup", "0::/user.slice/krab\n");
  EXPECT_EQ(cgroup_memory_limit(sources_, nullptr), -1);  // no file at all
  write("sys/user.slice/krab/memory.max", "max\n");
  EXPECT_EQ(cgroup_memory_limit(sources_, nullptr), -1);
  write("sys/user.slice/memory.max", "1073741824\n");
  std::string file;
  EXPECT_EQ(cgroup_memory_limit(sources_, &file), kGiB);
  EXPECT_EQ(file, (root_ / "sys/user.slice/memory.max").string());
  write("cgroup", "");  // no cgroup line: no limit
  EXPECT_EQ(cgroup_memory_limit(sources_, nullptr), -1);
}

TEST_F(FakeSystem, BudgetIsTheSmallerOfMemAvailableAndTheCgroupLimit) {
  write("meminfo", "MemTotal: 25165824 kB\nMemAvailable: 8388608 kB\n");  // 8 GiB
  write("cgroup", "4:memory:/cap\n");
  write("sys/memory/cap/memory.limit_in_bytes", std::to_string(2 * kGiB));
  MemoryBudget b = read_memory_budget(sources_);
  EXPECT_EQ(b.mem_available, 8 * kGiB);
  EXPECT_EQ(b.bytes(), 2 * kGiB);
  EXPECT_NE(b.source().find("cgroup limit in " + (root_ / "sys/memory/cap").string()),
            std::string::npos)
      << b.source();
  write("sys/memory/cap/memory.limit_in_bytes", std::to_string(16 * kGiB));
  b = read_memory_budget(sources_);
  EXPECT_EQ(b.bytes(), 8 * kGiB);
  EXPECT_EQ(b.source(), "MemAvailable in /proc/meminfo");
  fs::remove(root_ / "meminfo");
  fs::remove(root_ / "cgroup");
  EXPECT_EQ(read_memory_budget(sources_).bytes(), -1);  // nothing known: nothing refused
}

// The launcher stays resident, in the workers' cgroup, while they run: its VmRSS comes off the
// cgroup limit (MemAvailable already leaves it out), and the source says so.
TEST_F(FakeSystem, TheLaunchersOwnMemoryComesOffTheCgroupLimit) {
  write("meminfo", "MemAvailable: 8388608 kB\n");  // 8 GiB
  write("cgroup", "4:memory:/cap\n");
  write("sys/memory/cap/memory.limit_in_bytes", std::to_string(2 * kGiB));
  write("status", "Name:\tkrab\nVmHWM:\t 400000 kB\nVmRSS:\t  307200 kB\n");  // 300 MiB
  MemoryBudget b = read_memory_budget(sources_);
  EXPECT_EQ(b.launcher_bytes, 300 * (int64_t{1} << 20));
  EXPECT_EQ(b.bytes(), 2 * kGiB - 300 * (int64_t{1} << 20));
  EXPECT_NE(b.source().find(", 2.0 GiB less 300 MiB for the launcher itself, leaves"),
            std::string::npos)
      << b.source();
  // A limit above MemAvailable, whose figure already counts the launcher as used: MemAvailable.
  write("sys/memory/cap/memory.limit_in_bytes", std::to_string(16 * kGiB));
  b = read_memory_budget(sources_);
  EXPECT_EQ(b.bytes(), 8 * kGiB);
  // A launcher larger than the limit leaves no room at all (not a negative budget).
  write("sys/memory/cap/memory.limit_in_bytes", std::to_string(100 << 20));
  EXPECT_EQ(read_memory_budget(sources_).bytes(), 0);
  fs::remove(root_ / "status");  // unreadable: nothing comes off
  EXPECT_EQ(read_memory_budget(sources_).bytes(), 100 << 20);
}

// A GPT-like job on 4 workers: a root unit and 8 units of 2^26 parameters, Adam.
JobMemory gpt_like() {
  JobMemory job;
  job.model = "a gpt of 0.5 B parameters";
  job.inputs.unit_numel = {int64_t{1} << 24};
  for (int i = 0; i < 8; ++i) job.inputs.unit_numel.push_back(int64_t{1} << 26);
  job.inputs.world_size = 4;
  job.inputs.optimizer = zero::OptimizerKind::kAdam;
  job.activations_plain = 6 * kGiB;
  job.activations_checkpointed = kGiB / 2;
  job.inputs.activation_bytes = job.activations_plain;
  job.data_bytes = 0;
  return job;
}

int64_t worker_bytes(const JobMemory& job, int stage, bool checkpointing) {
  zero::MemoryInputs in = job.inputs;
  in.stage = stage;
  in.activation_checkpointing = checkpointing;
  in.activation_bytes = checkpointing ? job.activations_checkpointed : job.activations_plain;
  return zero::worker_peak_bytes(zero::predict_memory(in), job.data_bytes);
}

MemoryBudget budget_of(int64_t bytes) {
  MemoryBudget b;
  b.mem_available = bytes;
  return b;
}

std::string refusal(const JobMemory& job, int64_t per_worker) {
  try {
    check_job_memory(4, job, budget_of(4 * per_worker), "parallel.workers");
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

TEST(JobMemory, StageZeroNeedsTheClosedFormAndFitsWhenTheBudgetHoldsIt) {
  const JobMemory job = gpt_like();
  const int64_t psi = (int64_t{1} << 24) + 8 * (int64_t{1} << 26);
  // Stage 0, Adam: 4Ψ params + 4Ψ grads + 8Ψ optimizer + 4Ψ bucket mirror, Gloo's all-reduce
  // scratch (under one bucket: here a unit of 2^26, over the 25 MiB cap), plus activations,
  // 5% of all that for the heap's slack, and the process.
  const int64_t model = 20 * psi + 4 * (int64_t{1} << 26) + 6 * kGiB;
  const int64_t stage0 = model + model / 20 + (int64_t{192} << 20);
  EXPECT_EQ(worker_bytes(job, 0, false), stage0);
  EXPECT_NO_THROW(check_job_memory(4, job, budget_of(4 * stage0), "parallel.workers"));
  const std::string what = refusal(job, stage0 - 1);
  EXPECT_NE(what.find("parallel.zero_stage 0: a gpt of 0.5 B parameters needs about 18 GiB per "
                      "worker (parallel.workers 4: 2.1 GiB params, 2.1 GiB grads, 4.1 GiB "
                      "optimizer, 2.1 GiB working set, 256 MiB comm buffers, 6.0 GiB "
                      "activations, 848 MiB heap slack, 192 MiB process"),
            std::string::npos)
      << what;
  EXPECT_NE(what.find("but each has 18 GiB (MemAvailable in /proc/meminfo 70 GiB / 4)"),
            std::string::npos)
      << what;
}

// The advice is the first setting, in the order higher stage alone, checkpointing alone, both,
// whose predicted bytes fit; every setting before it does not fit.
TEST(JobMemory, AdviceIsTheCheapestSettingThatFitsByPrediction) {
  const JobMemory job = gpt_like();
  struct Case {
    int stage;
    bool checkpointing;
    std::string advice;
  };
  const std::vector<Case> cases = {
      {1, false, "it would fit with parallel.zero_stage: 1 ("},
      {2, false, "it would fit with parallel.zero_stage: 2 ("},
      {3, false, "it would fit with parallel.zero_stage: 3 ("},
      {0, true, "it would fit with model.activation_checkpointing: true ("},
      {3, true,
       "it would fit with parallel.zero_stage: 3 and model.activation_checkpointing: true ("},
  };
  std::vector<std::pair<int, bool>> order = {{1, false}, {2, false}, {3, false}, {0, true},
                                             {1, true},  {2, true},  {3, true}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.advice);
    const int64_t per_worker = worker_bytes(job, c.stage, c.checkpointing);
    // Only meaningful when every setting tried before this one needs more.
    bool earlier_fits = false;
    for (const auto& [s, k] : order) {
      if (s == c.stage && k == c.checkpointing) break;
      earlier_fits |= worker_bytes(job, s, k) <= per_worker;
    }
    if (earlier_fits) continue;
    EXPECT_NE(refusal(job, per_worker).find(c.advice), std::string::npos)
        << refusal(job, per_worker);
  }
  const std::string none = refusal(job, worker_bytes(job, 3, true) - 1);
  EXPECT_NE(none.find("it does not fit even at parallel.zero_stage: 3 and "
                      "model.activation_checkpointing: true"),
            std::string::npos)
      << none;
}

// Stage 3 with disk offload: the master shards and Adam's state leave RAM, so a budget that
// holds the gradient shard (4Ψ/N), the two-unit window and the working set admits a job that
// stage 3 in RAM (16Ψ/N) does not fit.
TEST(JobMemory, StageThreeWithDiskOffloadNeedsOnlyTheGradientShardAndTheWindow) {
  JobMemory job = gpt_like();
  job.inputs.stage = 3;
  job.inputs.activation_checkpointing = true;
  job.inputs.activation_bytes = job.activations_checkpointed;
  const int64_t in_ram = zero::worker_peak_bytes(zero::predict_memory(job.inputs), job.data_bytes);
  job.inputs.offload = zero::Offload::kDisk;
  const zero::MemoryPrediction off = zero::predict_memory(job.inputs);
  const int64_t psi = (int64_t{1} << 24) + 8 * (int64_t{1} << 26), n = 4;
  const int64_t window = 2 * (int64_t{1} << 26) / n;  // two of the largest unit's shards
  EXPECT_EQ(off.grads, 4 * psi / n);
  EXPECT_EQ(off.params, 4 * window);
  EXPECT_EQ(off.optimizer, 4 * 2 * window);
  EXPECT_EQ(off.offloaded, 12 * psi / n);
  const int64_t with_offload = zero::worker_peak_bytes(off, job.data_bytes);
  ASSERT_LT(with_offload, in_ram);
  EXPECT_NO_THROW(check_job_memory(4, job, budget_of(4 * with_offload), "parallel.workers"));
  job.inputs.offload = zero::Offload::kNone;
  EXPECT_THROW(check_job_memory(4, job, budget_of(4 * with_offload), "parallel.workers"),
               InvalidArgument);
}

TEST(JobMemory, TooManyProcessesIsTheWorkerCountsFault) {
  JobMemory job = gpt_like();
  job.inputs.unit_numel = {1000};
  job.activations_plain = job.inputs.activation_bytes = 0;
  try {
    check_job_memory(500, job, budget_of(24 * kGiB), "--nproc-per-node");
    ADD_FAILURE() << "500 workers fit in 24 GiB?";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("--nproc-per-node: 500 worker processes"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("use fewer workers"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(check_job_memory(500, job, MemoryBudget{}, "parallel.workers"));
}

}  // namespace
}  // namespace krab::cli
