// The bottleneck report end to end (train/bottleneck.h), on staged runs whose bottleneck is
// known by construction: one worker slowed by a fixed delay (it is named, the others wait,
// parallel.balance is suggested), and images decoded by one thread from large noise PNGs
// for a tiny model (data-bound, data.decode_threads suggested). The slow network's case is
// tests/net/two_hosts.sh shaped (20 Mbit/s: communication, comm.compression).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "data/image_util.h"
#include "data/test_util.h"

namespace krab::train {
namespace {

namespace fs = std::filesystem;
using data::testing::TempDir;

const std::string kKrab = std::string(KRAB_BINARY_DIR) + "/bin/krab";

std::pair<int, std::string> run(const std::string& cmd, int timeout = 120) {
  std::string out;
  FILE* p = ::popen(("timeout -k 5 " + std::to_string(timeout) + " " + cmd + " 2>&1").c_str(), "r");
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int status = ::pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

double mean_share(const nlohmann::json& b, const char* share) {
  double sum = 0;
  for (const auto& r : b["ranks"]) sum += r[share].get<double>();
  return sum / static_cast<double>(b["ranks"].size());
}

nlohmann::json train(TempDir& dir, const std::string& job, const std::string& printed) {
  std::ofstream(dir.file("job.yaml")) << job;
  const auto [code, out] =
      run(kKrab + " train " + dir.file("job.yaml") + " --set checkpoint.dir=" + dir.file("runs") +
          " --report " + dir.file("report.json"));
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find(printed), std::string::npos) << out;
  std::ifstream in(dir.file("report.json"));
  return nlohmann::json::parse(in).at("bottleneck");
}

TEST(BottleneckE2E, AWorkerSlowedByAFixedDelayIsNamedAndBalanceIsSuggested) {
  TempDir dir;
  // Rank 2 sleeps 25 ms after each forward+backward of a model that computes in well under a
  // millisecond: the others wait for it at every all-reduce.
  const auto b = train(dir,
                       "model: {name: mlp, hidden: 32}\n"
                       "data: {name: synthetic, synthetic_samples: 2048, batch_size: 32}\n"
                       "train: {steps: 40, slow_rank: 2, slow_delay_ms: 25,"
                       " optimizer: {name: sgd, lr: 0.05}}\n"
                       "parallel: {workers: 3}\ncomm: {timeout_s: 30}\n",
                       "krab: slowest rank: 2 (");
  EXPECT_EQ(b["slowest_rank"], 2);
  EXPECT_EQ(b["largest"], "waiting");
  EXPECT_EQ(b["suggestion"]["key"], "parallel.balance");
  EXPECT_EQ(b["suggestion"]["value"], "auto");
  // The delay is the slow rank's compute and the others' wait: each near 25 ms of the step.
  for (const auto& r : b["ranks"]) {
    const double wait_ms = r["waiting"].get<double>() * r["step_seconds"].get<double>() * 1000;
    const double compute_ms = r["compute"].get<double>() * r["step_seconds"].get<double>() * 1000;
    if (r["rank"] == 2) {
      EXPECT_GE(compute_ms, 25) << r;
      EXPECT_LT(wait_ms, 5) << r;
    } else {
      EXPECT_GT(wait_ms, 15) << r;
      EXPECT_LT(compute_ms, 10) << r;
    }
  }
}

// Pixels that do not compress: a PNG of them takes milliseconds to decode.
std::vector<uint8_t> noise(uint32_t seed, size_t n) {
  std::vector<uint8_t> p(n);
  for (auto& v : p) {
    seed = seed * 1664525u + 1013904223u;
    v = static_cast<uint8_t>(seed >> 24);
  }
  return p;
}

TEST(BottleneckE2E, ImagesDecodedByOneThreadMakeTheRunDataBound) {
  TempDir dir;
  // 60 noise PNGs of 384x384 RGB, resized to 128x128 (49 KiB decoded: the smallest cache,
  // 1 MiB, holds 21 of each worker's 30) for an MLP of hidden width 2 (98k parameters: its
  // all-reduce stays far below the decoding): decoding is most of a step.
  for (int k = 0; k < 2; ++k) {
    const fs::path cls = fs::path(dir.file("train")) / ("class" + std::to_string(k));
    fs::create_directories(cls);
    for (int i = 0; i < 30; ++i)
      data::testing::write_png((cls / (std::to_string(i) + ".png")).string(), 384, 384, 3,
                               noise(static_cast<uint32_t>(k * 30 + i), 384 * 384 * 3));
  }
  const auto b = train(dir,
                       "model: {name: mlp, hidden: 2}\n"
                       "data: {name: images, path: " +
                           dir.file("train") +
                           ", size: 128x128, decode_threads: 1, cache_mb: 1, batch_size: 8}\n"
                           "train: {steps: 12, optimizer: {name: sgd, lr: 0.05}}\n"
                           "parallel: {workers: 2}\ncomm: {timeout_s: 30}\n",
                       "; try data.decode_threads: 2 (");
  // Data is what the slowest rank spends most of its step on, and the suggestion addresses it
  // (the other rank may spend its step waiting for that one: largest may be data or waiting).
  const int slowest = b["slowest_rank"].get<int>();
  const auto& slow = b["ranks"][slowest];
  EXPECT_GT(slow["data"].get<double>(), 0.5) << b;
  EXPECT_EQ(b["suggestion"]["key"], "data.decode_threads");
  EXPECT_GT(mean_share(b, "data") + mean_share(b, "waiting"), 0.5) << b;
}

}  // namespace
}  // namespace krab::train
