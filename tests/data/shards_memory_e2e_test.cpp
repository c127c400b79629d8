// data.name: tensors with a directory of shards three times larger than data.cache_mb trains,
// and a worker's peak resident memory stays bounded by the cache, not by the data set.
//
// Measured from outside: the job runs as a child of this test, whose wait4() reports the
// largest peak RSS (ru_maxrss) of that child and of every descendant it waited for (Linux keeps
// the maximum over reaped descendants): the launcher and its workers, which the launcher reaps.
// The same job runs on three data sets of one kind (float32 examples of 1024 features):
//   base: one small shard (the job's memory without data to speak of);
//   lazy: 12 shards of 8 MiB (96 MiB) with data.cache_mb 32;
//   held: the same 96 MiB with a cache that holds all of it.
// Expectations, independent of krab's own accounting: held - base sees the whole data set (the
// measurement is not blind to data), held - lazy is at least half of it, and lazy - base stays
// below the cache plus a slack (see kSlackMib).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <torch/torch.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <thread>

#include "cli/cli_support.h"
#include "core/fs.h"

namespace {

using namespace krab::cli_test;

constexpr int64_t kFeatures = 1024, kShardRows = 2048, kShards = 12;  // 8 MiB of x per shard
constexpr int64_t kCacheMib = 32, kDataMib = kShards * kShardRows * kFeatures * 4 >> 20;
// Beyond the cache (which counts the shard being read: shards.cpp evicts before reading), a
// worker holds its batch (x of 128 examples: 0.5 MiB, and the slices gathered for it as much
// again); runs of one job differ by about 1 MiB. 8 MiB covers those, and is one shard: before
// shards.cpp trimmed the heap after an eviction, a freed shard stayed resident and a worker
// held 13-22 MiB over its cache (lazy - base was 45 MiB here), which this bound catches.
constexpr int64_t kSlackMib = 8;

// torch.save({"x": X, "y": Y}) as LibTorch writes it (torch::pickle_save: the same zip archive
// Python's torch.save writes and torch.load reads).
void save_xy(const fs::path& file, int64_t rows, int64_t seed) {
  torch::manual_seed(seed);
  c10::Dict<std::string, at::Tensor> xy;
  xy.insert("x", torch::randn({rows, kFeatures}));
  xy.insert("y", torch::randint(0, 10, {rows}, torch::kLong));
  const std::vector<char> bytes = torch::pickle_save(c10::IValue(xy));
  fs::create_directories(file.parent_path());
  krab::core::write_file_atomic(file.string(), std::string(bytes.begin(), bytes.end()));
}

struct Peak {
  int64_t rss_mib = 0;
  nlohmann::json report;
};

class ShardsMemory : public Cli {
 protected:
  // `krab train job.yaml ARGS...` in the test's directory: its exit code must be 0; returns the
  // peak RSS of the launcher and its workers, the largest of them, and the run's report.
  Peak train(const std::string& name, std::vector<std::string> args) {
    const std::string log = (dir_ / (name + ".log")).string();
    args.insert(args.begin(), {"train", "job.yaml", "--report", name + ".json", "--set",
                               "checkpoint.dir=" + name});
    const pid_t pid = start_krab(dir_, log, args);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    int status = 0;
    rusage usage{};
    pid_t got = 0;
    while ((got = ::wait4(pid, &status, WNOHANG, &usage)) == 0 &&
           std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (got == 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      ADD_FAILURE() << name << ": still running after 120 s";
      return {};
    }
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << name << ": " << krab::core::read_file(log);
    Peak peak;
    peak.rss_mib = usage.ru_maxrss >> 10;  // KiB on Linux
    peak.report = nlohmann::json::parse(krab::core::read_file((dir_ / (name + ".json")).string()));
    return peak;
  }
};

TEST_F(ShardsMemory, ShardsThreeTimesTheCacheTrainInBoundedMemory) {
  for (int64_t s = 0; s < kShards; ++s)
    save_xy(dir_ / "shards" / ("train-" + std::to_string(100 + s) + ".pt"), kShardRows, s);
  save_xy(dir_ / "small" / "train.pt", 512, 100);
  save_xy(dir_ / "test.pt", 256, 101);
  // One epoch exactly: 96 steps x 2 workers x 128 = 24,576 examples, every one of the 12 shards.
  write("job.yaml", R"(
model: {name: mlp, hidden: 32}
data: {name: tensors, path: shards, test_path: test.pt, batch_size: 128, cache_mb: 32}
train: {steps: 96, eval_every: 0, optimizer: {name: sgd, lr: 0.01}}
parallel: {workers: 2}
comm: {timeout_s: 60}
)");
  const Peak lazy = train("lazy", {});
  const Peak held = train("held", {"--set", "data.cache_mb=" + std::to_string(4 * kCacheMib)});
  const Peak base = train("base", {"--set", "data.path=small"});
  ASSERT_GT(base.rss_mib, 0);
  const auto& r = lazy.report;
  EXPECT_GE(r["steps"].get<int64_t>() * r["global_batch"].get<int64_t>(),
            kShards * kShardRows);  // the run visited every example, so every shard
  std::printf("peak RSS (MiB): base %lld, lazy %lld (cache %lld of %lld MiB), held %lld\n",
              static_cast<long long>(base.rss_mib), static_cast<long long>(lazy.rss_mib),
              static_cast<long long>(kCacheMib), static_cast<long long>(kDataMib),
              static_cast<long long>(held.rss_mib));
  // Holding every shard shows as the data set's size: RSS measures what the test thinks.
  EXPECT_GE(held.rss_mib - base.rss_mib, kDataMib - kSlackMib);
  EXPECT_GE(held.rss_mib - lazy.rss_mib, kDataMib / 2);
  EXPECT_LE(lazy.rss_mib - base.rss_mib, kCacheMib + kSlackMib);
}

}  // namespace
