// train/report.h: the report every mode writes, and the sinks the loop reports through.
#include "train/report.h"

#include <gtest/gtest.h>

namespace krab::train {
namespace {

TEST(ReportSink, KeepsEvaluationsAtTheSecondsOfTheirStepAndCounterTotals) {
  core::Events events;
  auto record = std::make_shared<ReportSink>();
  events.add(record);
  events.gauge("loss", 2.0, 10);  // not an evaluation
  events.gauge("train_seconds", 1.5, 10);
  events.gauge("test_accuracy", 0.75, 10);
  events.gauge("train_seconds", 3.0, 20);
  events.gauge("test_accuracy", 0.8, 20);
  events.counter("bytes_sent", 100);
  events.counter("bytes_sent", 23);
  const nlohmann::json expected =
      nlohmann::json::array({{{"step", 10}, {"seconds", 1.5}, {"test_accuracy", 0.75}},
                             {{"step", 20}, {"seconds", 3.0}, {"test_accuracy", 0.8}}});
  EXPECT_EQ(record->evals(), expected);
  EXPECT_EQ(record->total("bytes_sent"), 123);
  EXPECT_EQ(record->total("never"), 0);
}

// The bar shows the step's loss as the step lines and the summary do (describe_loss), not a
// smoothed or rounded one (issue 25: "loss 0.5" beside "final loss 0.3917").
TEST(LossAndRateFields, TheLossAsEveryOutputShowsItAndRateAndNotMeasuredAtTheEnd) {
  const auto format = loss_and_rate_fields();
  ProgressSink::Gauges g{{"samples_per_sec", 1234.4}};
  EXPECT_EQ(format(g, false), "1234 samples/s");  // no loss shared yet
  g["loss"] = 0.1234564;
  EXPECT_EQ(format(g, false), "loss 0.123456 | 1234 samples/s");
  g["samples_per_sec"] = 0;
  EXPECT_EQ(format(g, false), "loss 0.123456 | 0.0 samples/s");
  EXPECT_EQ(format(g, true), "loss 0.123456 | samples/s not measured");
  EXPECT_EQ(describe_loss(0.39419), "0.39419");
  EXPECT_EQ(describe_loss(1.5e-5), "1.5e-05");
}

TEST(MakeReport, AppendsTheFinalEvaluationAndMergesTheEngineFields) {
  RunOutcome o;
  o.workers = 2;
  o.steps = 30;
  o.test_accuracy = 0.9;
  o.train_seconds = 4;
  o.samples_per_sec = 0;  // nothing measured: null and a note
  o.evals = nlohmann::json::array({{{"step", 10}, {"seconds", 1.0}, {"test_accuracy", 0.5}}});
  const auto r = make_report(o, {{"compression", "fp16"}, {"buckets", 3}}, {{"name", "x"}});
  ASSERT_EQ(r["evals"].size(), 2u);
  EXPECT_EQ(r["evals"][1]["step"], 30);
  EXPECT_EQ(r["evals"][1]["seconds"], 4.0);
  EXPECT_EQ(r["test_accuracy"], 0.9);
  EXPECT_EQ(r["compression"], "fp16");
  EXPECT_EQ(r["buckets"], 3);
  EXPECT_TRUE(r["samples_per_sec"].is_null());
  EXPECT_EQ(describe_samples_per_sec(r), "samples/s not measured");
  EXPECT_EQ(r["config"]["name"], "x");
  EXPECT_FALSE(r.contains("eval_examples"));  // the whole test split: nothing to say
}

// train.eval_examples: a reader of the report learns that accuracy is a subset's.
TEST(MakeReport, SaysHowManyExamplesWereEvaluatedWhenLimited) {
  RunOutcome o;
  o.test_accuracy = 0.75;
  o.eval_examples = 500;
  const auto r = make_report(o, {}, {});
  EXPECT_EQ(r["eval_examples"], 500);
  EXPECT_EQ(r["test_accuracy"], 0.75);
}

// train.metric loss: the report says so, carries test_loss where accuracy would be, and the
// sink keeps "test_loss" gauges as evaluations.
TEST(MakeReport, ALossMetricReportsTestLoss) {
  core::Events events;
  auto record = std::make_shared<ReportSink>();
  events.add(record);
  events.gauge("train_seconds", 1.5, 10);
  events.gauge("test_loss", 0.25, 10);
  RunOutcome o;
  o.steps = 20;
  o.train_seconds = 3;
  o.test_loss = 0.125;
  o.evals = record->evals();
  const auto r = make_report(o, {}, {});
  EXPECT_EQ(r["metric"], "loss");
  EXPECT_EQ(r["test_loss"], 0.125);
  EXPECT_FALSE(r.contains("test_accuracy"));
  const nlohmann::json expected =
      nlohmann::json::array({{{"step", 10}, {"seconds", 1.5}, {"test_loss", 0.25}},
                             {{"step", 20}, {"seconds", 3.0}, {"test_loss", 0.125}}});
  EXPECT_EQ(r["evals"], expected);
  EXPECT_EQ(describe_test_metric(r), "test loss 0.125");
  o.test_loss.reset();
  o.test_accuracy = 0.8125;
  const auto a = make_report(o, {}, {});
  EXPECT_EQ(a["metric"], "accuracy");
  EXPECT_EQ(describe_test_metric(a), "test accuracy 0.8125");
  EXPECT_EQ(describe_test_metric(nlohmann::json::object()), "");
}

TEST(MeasurementWarmup, ATenthOfTheRunBetweenOneAndTen) {
  EXPECT_EQ(measurement_warmup(1), 1);
  EXPECT_EQ(measurement_warmup(35), 3);
  EXPECT_EQ(measurement_warmup(1000), 10);
}

}  // namespace
}  // namespace krab::train
