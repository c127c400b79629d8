// train/bottleneck.h: the shares, the slowest rank and the suggestion, against totals whose
// breakdown is known in closed form.
#include "train/bottleneck.h"

#include <gtest/gtest.h>

#include "train/step_phases.h"

namespace krab::train {
namespace {

using P = PhaseTotals;

// `steps` steps of the given per-step seconds; the step span is their sum plus `rest`.
// `loss`: the shared loss's all-reduce, inside `end`.
P totals(int64_t steps, double data, double fwd, double bwd, double reduce, double opt,
         double after = 0, double end = 0, double rest = 0, double loss = 0) {
  P t;
  t.steps = steps;
  const double n = static_cast<double>(steps);
  t.seconds[P::kData] = data * n;
  t.seconds[P::kForward] = fwd * n;
  t.seconds[P::kBackward] = bwd * n;
  t.seconds[P::kReduce] = reduce * n;
  t.seconds[P::kOptimizer] = opt * n;
  t.seconds[P::kAfter] = after * n;
  t.seconds[P::kEnd] = end * n;
  t.seconds[P::kLoss] = loss * n;
  t.seconds[P::kStep] = (data + fwd + bwd + reduce + opt + after + end + rest) * n;
  return t;
}

TEST(Bottleneck, AStragglerIsNamedAndTheOthersWaitForIt) {
  // Rank 1 computes 0.3 s; the others 0.1 s and then wait 0.2 s in reduce; the communication
  // nobody hid is the 0.01 s the straggler spends in reduce.
  const std::vector<P> ranks = {totals(10, 0, 0.04, 0.06, 0.21, 0.01),
                                totals(10, 0, 0.12, 0.18, 0.01, 0.01),
                                totals(10, 0, 0.04, 0.06, 0.21, 0.01)};
  const auto b = bottleneck_report(ranks, RunShape{3});
  EXPECT_EQ(b["slowest_rank"], 1);
  EXPECT_EQ(b["largest"], "waiting");
  EXPECT_EQ(b["suggestion"]["key"], "parallel.balance");
  EXPECT_EQ(b["suggestion"]["value"], "auto");
  const auto& r0 = b["ranks"][0];
  EXPECT_NEAR(r0["step_seconds"].get<double>(), 0.32, 1e-12);
  EXPECT_NEAR(r0["compute"].get<double>(), 0.10 / 0.32, 1e-12);
  EXPECT_NEAR(r0["communication"].get<double>(), 0.01 / 0.32, 1e-12);
  EXPECT_NEAR(r0["waiting"].get<double>(), 0.20 / 0.32, 1e-12);
  EXPECT_NEAR(r0["optimizer"].get<double>(), 0.01 / 0.32, 1e-12);
  EXPECT_NEAR(r0["other"].get<double>(), 0, 1e-12);
  EXPECT_NEAR(b["ranks"][1]["waiting"].get<double>(), 0, 1e-12);
  // With the balancer on already, the suggestion moves on.
  RunShape balanced{3};
  balanced.balance = "auto";
  EXPECT_EQ(bottleneck_report(ranks, balanced)["suggestion"]["key"], "elastic.enabled");
}

TEST(Bottleneck, AWaitAtTheSharedLossCountsAsWaiting) {
  // A straggler slow after it launched its buckets: the others' reduce ends in time and they
  // wait for it at the shared loss instead.
  const std::vector<P> ranks = {totals(10, 0, 0.04, 0.06, 0.01, 0.01, 0, 0.21, 0, 0.205),
                                totals(10, 0, 0.12, 0.18, 0.01, 0.01, 0, 0.006, 0, 0.005)};
  const auto b = bottleneck_report(ranks, RunShape{2});
  EXPECT_EQ(b["largest"], "waiting");
  EXPECT_EQ(b["slowest_rank"], 1);
  EXPECT_NEAR(b["ranks"][0]["waiting"].get<double>(), 0.2 / 0.33, 1e-12);
  EXPECT_NEAR(b["ranks"][0]["other"].get<double>(), 0.005 / 0.33, 1e-12);
}

TEST(Bottleneck, ASlowestRankSlowedByItsDataSuggestsDecodeThreads) {
  // Rank 0 waits for its images; rank 1 waits for rank 0.
  RunShape images{2};
  images.decodes_images = true;
  images.decode_threads = 1;
  const std::vector<P> ranks = {totals(10, 0.2, 0.02, 0.03, 0.01, 0.01),
                                totals(10, 0.02, 0.02, 0.03, 0.19, 0.01)};
  const auto b = bottleneck_report(ranks, images);
  EXPECT_EQ(b["slowest_rank"], 0);
  EXPECT_EQ(b["suggestion"]["key"], "data.decode_threads");
  EXPECT_EQ(b["suggestion"]["value"], "2");
}

TEST(Bottleneck, ExposedCommunicationSuggestsCompressionThenLocalSgd) {
  // Every rank spends 0.5 s of a 0.6 s step in reduce + after: a slow link.
  const std::vector<P> ranks = {totals(4, 0, 0.03, 0.06, 0.45, 0.01, 0.05),
                                totals(4, 0, 0.03, 0.06, 0.46, 0.01, 0.05)};
  RunShape shape{2};
  auto b = bottleneck_report(ranks, shape);
  EXPECT_EQ(b["largest"], "communication");
  EXPECT_EQ(b["suggestion"]["key"], "comm.compression");
  EXPECT_NEAR(b["ranks"][0]["communication"].get<double>(), 0.50 / 0.60, 1e-12);
  EXPECT_NEAR(b["ranks"][1]["waiting"].get<double>(), 0.01 / 0.61, 1e-12);
  shape.compression = "powersgd";
  EXPECT_EQ(bottleneck_report(ranks, shape)["suggestion"]["key"], "sync.mode");
  shape.sync_mode = "local_sgd";
  EXPECT_EQ(bottleneck_report(ranks, shape)["suggestion"]["key"], "parallel.bucket_mb");
}

TEST(Bottleneck, DataOptimizerAndComputeBound) {
  RunShape images{2};
  images.decodes_images = true;
  images.decode_threads = 2;
  const std::vector<P> data = {totals(5, 0.2, 0.02, 0.03, 0.01, 0.01),
                               totals(5, 0.2, 0.02, 0.03, 0.01, 0.01)};
  auto b = bottleneck_report(data, images);
  EXPECT_EQ(b["largest"], "data");
  EXPECT_EQ(b["suggestion"]["key"], "data.decode_threads");
  EXPECT_EQ(b["suggestion"]["value"], "4");

  const std::vector<P> update = {totals(5, 0, 0.02, 0.03, 0.01, 0.2),
                                 totals(5, 0, 0.02, 0.03, 0.01, 0.2)};
  EXPECT_EQ(bottleneck_report(update, RunShape{2})["suggestion"]["key"], "parallel.zero_stage");

  // Every overhead under a tenth of the step: compute-bound.
  const std::vector<P> compute = {totals(5, 0.005, 0.4, 0.5, 0.02, 0.02),
                                  totals(5, 0.005, 0.4, 0.5, 0.03, 0.02)};
  b = bottleneck_report(compute, RunShape{2});
  EXPECT_EQ(b["largest"], "compute");
  EXPECT_EQ(b["suggestion"]["key"], "parallel.workers");
}

TEST(Bottleneck, RanksWithoutStepsAreLeftOutAndNoneGivesNull) {
  EXPECT_TRUE(bottleneck_report({P{}, P{}}, RunShape{2}).is_null());
  // A joiner that timed nothing yet does not make the communication zero.
  const auto b = bottleneck_report({totals(3, 0, 0.1, 0.1, 0.3, 0), P{}}, RunShape{2});
  ASSERT_EQ(b["ranks"].size(), 1u);
  EXPECT_NEAR(b["ranks"][0]["communication"].get<double>(), 0.6, 1e-12);
}

TEST(Bottleneck, TheSinkSumsTheStepPhasesOnly) {
  core::Events events;
  auto shared = std::make_shared<PhaseSink>();
  events.add(shared);
  events.span(phase::kForward, 0.25);
  events.span(phase::kForward, 0.25);
  events.span(phase::kStep, 1.0);
  events.span(phase::kEvaluation, 3.0);  // inside step.end: not a phase of its own
  events.span("comm.bucket.0", 0.5);
  EXPECT_EQ(shared->totals().seconds[P::kForward], 0.5);
  EXPECT_EQ(shared->totals().seconds[P::kStep], 1.0);
  EXPECT_EQ(shared->totals().steps, 1);
  double sum = 0;
  for (double s : shared->totals().seconds) sum += s;
  EXPECT_EQ(sum, 1.5);
  shared->reset();
  EXPECT_EQ(shared->totals().steps, 0);
}

TEST(Bottleneck, TheLinesNameTheSharesTheSlowestRankAndTheKey) {
  const std::vector<P> ranks = {totals(10, 0, 0.04, 0.06, 0.21, 0.01),
                                totals(10, 0, 0.12, 0.19, 0.01, 0.01)};
  const auto lines = describe_bottleneck(bottleneck_report(ranks, RunShape{2}));
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0].rfind("step time: compute 63%, communication 3%, waiting 31%", 0), 0u)
      << lines[0];
  EXPECT_EQ(lines[1], "slowest rank: 1 (330 ms per step)");
  EXPECT_EQ(lines[2].rfind("largest: waiting; try parallel.balance: auto (rank 1 ", 0), 0u)
      << lines[2];
}

}  // namespace
}  // namespace krab::train
