// train.adaptive_batch end to end, on 2 worker processes of a small MLP on synthetic data, with
// the overhead fixed (train.adaptive_batch.overhead_examples) so that the batches depend on
// the gradients alone:
//   - a run stopped at step 25 and resumed ends bit-identical to the uninterrupted run, with
//     the same batch schedule (the checkpoint carries it);
//   - with expensive steps the batch grows, each choice within one micro-batch of the
//     closed-form optimum sqrt(B_noise · a/c) of the noise scale it recorded; with cheap steps
//     it stays at the smallest batch, and the run is then bit-identical to a fixed batch;
//   - bounds and combinations it cannot run are refused before training (exit 2, key named).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "data/test_util.h"

namespace krab::train {
namespace {

using data::testing::TempDir;

const std::string kKrab = std::string(KRAB_BINARY_DIR) + "/bin/krab";

const char* const kJob =
    "model: {name: mlp, hidden: 64}\n"
    "data: {name: synthetic, synthetic_samples: 8192, batch_size: 32}\n"
    "train: {steps: 150, optimizer: {name: sgd, lr: 0.05},\n"
    "        adaptive_batch: {max: 512, overhead_examples: 4096}}\n"
    "parallel: {workers: 2}\ncomm: {timeout_s: 30}\n";

std::pair<int, std::string> run(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen(("timeout -k 5 120 " + cmd + " 2>&1").c_str(), "r");
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int status = ::pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Trains the job with `sets` into DIR/name; the report.
nlohmann::json train(TempDir& dir, const std::string& name, const std::string& sets) {
  std::ofstream(dir.file("job.yaml")) << kJob;
  const auto [code, out] =
      run(kKrab + " train " + dir.file("job.yaml") + " --set checkpoint.dir=" + dir.file(name) +
          " --report " + dir.file(name + ".json") + " " + sets);
  EXPECT_EQ(code, 0) << out;
  if (code != 0) return nlohmann::json::object();
  return nlohmann::json::parse(slurp(dir.file(name + ".json")));
}

std::vector<int64_t> batches(const nlohmann::json& report) {
  std::vector<int64_t> out;
  for (const auto& c : report.at("adaptive_batch").at("changes")) out.push_back(c["batch"]);
  return out;
}

TEST(AdaptiveBatchE2E, AResumedRunEndsBitIdenticalToTheUninterruptedOne) {
  TempDir dir;
  const auto full = train(dir, "full", "");
  train(dir, "part", "--set train.steps=25");  // its last step decides the next batch
  const auto resumed = train(dir, "part", "--set checkpoint.resume=true");
  ASSERT_TRUE(full.contains("adaptive_batch") && resumed.contains("adaptive_batch"));
  EXPECT_EQ(resumed["start_step"], 25);
  // The schedule changed after the resume point, so the checkpoint had to carry it.
  ASSERT_GT(full["adaptive_batch"]["changes"].size(), 1u) << full["adaptive_batch"];
  EXPECT_EQ(full["adaptive_batch"]["changes"], resumed["adaptive_batch"]["changes"]);
  EXPECT_EQ(full["steps"], resumed["steps"]);
  EXPECT_EQ(slurp(dir.file("full/model.pt")), slurp(dir.file("part/model.pt")));
}

TEST(AdaptiveBatchE2E, ExpensiveStepsGrowTheBatchToTheGoodputOptimum) {
  TempDir dir;
  const auto r = train(dir, "grow", "");
  ASSERT_TRUE(r.contains("adaptive_batch"));
  const auto& a = r["adaptive_batch"];
  EXPECT_EQ(a["min"], 64);
  EXPECT_EQ(a["max"], 512);
  ASSERT_GT(a["changes"].size(), 1u) << a;
  EXPECT_GT(batches(r).back(), 64);
  // Every change: within one micro-batch of B* = sqrt(B_noise · 4096), clamped to the bounds.
  for (size_t k = 1; k < a["changes"].size(); ++k) {
    const auto& c = a["changes"][k];
    const double best = std::clamp(std::sqrt(c["noise_scale"].get<double>() * 4096.0), 64.0, 512.0);
    EXPECT_LE(std::abs(c["batch"].get<double>() - best), 64.0) << c;
  }
  // The examples trained are the 150 steps of 64 asked for, in fewer, larger steps.
  const auto fixed = train(dir, "fixed", "--set train.adaptive_batch.max=0");
  EXPECT_EQ(fixed["steps"], 150);
  EXPECT_LT(r["steps"].get<int64_t>(), 150);
  EXPECT_EQ(r["epochs"], fixed["epochs"]);
}

TEST(AdaptiveBatchE2E, CheapStepsKeepTheSmallestBatchBitIdenticalToAFixedOne) {
  TempDir dir;
  const auto adaptive = train(dir, "cheap", "--set train.adaptive_batch.overhead_examples=1");
  ASSERT_TRUE(adaptive.contains("adaptive_batch"));
  EXPECT_EQ(batches(adaptive), std::vector<int64_t>{64});
  EXPECT_GT(adaptive["adaptive_batch"]["decisions"].size(), 3u);  // it did decide, to stay
  const auto fixed = train(dir, "fixed", "--set train.adaptive_batch.max=0");
  EXPECT_FALSE(fixed.contains("adaptive_batch"));
  EXPECT_EQ(adaptive["steps"], fixed["steps"]);
  EXPECT_EQ(slurp(dir.file("cheap/model.pt")), slurp(dir.file("fixed/model.pt")));
}

TEST(AdaptiveBatchE2E, WhatItCannotRunIsRefusedBeforeTraining) {
  TempDir dir;
  std::ofstream(dir.file("job.yaml")) << kJob;
  const auto refused = [&](const std::string& sets, const std::string& named) {
    const auto [code, out] = run(kKrab + " train " + dir.file("job.yaml") +
                                 " --set checkpoint.dir=" + dir.file("no") + " " + sets);
    EXPECT_EQ(code, 2) << sets << "\n" << out;
    EXPECT_NE(out.find(named), std::string::npos) << sets << "\n" << out;
    EXPECT_EQ(out.find("step 1"), std::string::npos) << out;
  };
  refused("--set train.adaptive_batch.max=500", "train.adaptive_batch.max 500 is not a multiple");
  refused("--set train.adaptive_batch.min=96", "train.adaptive_batch.min 96");
  refused("--set train.adaptive_batch.min=1024", "is below train.adaptive_batch.min 1024");
  refused("--set train.adaptive_batch.max=8192", "training examples");
  refused("--set parallel.workers=1", "parallel.workers");
  refused("--set comm.compression=powersgd", "comm.compression");
  refused("--set train.grad_accum=2", "train.grad_accum");
  refused("--set sync.mode=local_sgd", "sync.mode");
  // A fixed run's checkpoint is not resumed by an adaptive one.
  ASSERT_EQ(run(kKrab + " train " + dir.file("job.yaml") + " --set checkpoint.dir=" +
                dir.file("f") + " --set train.adaptive_batch.max=0 --set train.steps=5")
                .first,
            0);
  const auto [code, out] =
      run(kKrab + " train " + dir.file("job.yaml") + " --set checkpoint.dir=" + dir.file("f") +
          " --set checkpoint.resume=true");
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(out.find("without train.adaptive_batch"), std::string::npos) << out;
}

}  // namespace
}  // namespace krab::train
