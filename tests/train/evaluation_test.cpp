// train/evaluation.h: the metric on the first train.eval_examples of a test split, on 1 and 2
// thread-ranks over loopback Gloo, against the same examples scored here in one forward pass
// (argmax against the labels; the loss of the whole subset as one batch). The split is longer
// than an evaluation batch (kEvaluationBatch), so the subsets cross batch and rank boundaries.
#include "train/evaluation.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <vector>

#include "support/gloo_ranks.h"

namespace krab::train {
namespace {

constexpr int64_t kTestExamples = 1300;

class EvaluationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    torch::set_num_threads(1);
    // 2600 examples, the last half the test split; an MLP that has not learned them scores
    // somewhere between 0 and 1 (a subset's accuracy then differs from the whole split's).
    d_ = data::make_synthetic(2 * kTestExamples, 6, 4, 0.5, 11);
    ASSERT_EQ(d_.testing()->size(), kTestExamples);
    models::ModelSpec spec;
    spec.name = "mlp";
    spec.input_shape = {6};
    spec.num_classes = 4;
    spec.hidden = 16;
    // One model per rank, bit-identical (same seed): ranks evaluate concurrently.
    for (int r = 0; r < 2; ++r) {
      torch::manual_seed(3);
      models_.push_back(models::make_model(spec));
      models_.back()->eval();
    }
  }

  // The expectation: the first n test examples in one batch.
  double expected(Metric metric, int64_t n) {
    torch::NoGradGuard no_grad;
    const at::Tensor x = d_.test->inputs.narrow(0, 0, n), y = d_.test->targets.narrow(0, 0, n);
    models::Model& m = *models_[0];
    if (metric == Metric::kLoss) return m.training_loss(x, y).item<double>();
    return m.predict(x).argmax(1).eq(y).sum().item<double>() / static_cast<double>(n);
  }

  // evaluate() on `ranks` thread-ranks; every rank's value, which must agree.
  std::vector<double> on_ranks(int ranks, Metric metric, int64_t eval_examples) {
    std::vector<double> values(static_cast<size_t>(ranks));
    krab::testing::run_gloo_ranks(ranks, [&](int r, comm::Communicator& c) {
      values[static_cast<size_t>(r)] =
          evaluate(*models_[static_cast<size_t>(r)], metric, *d_.testing(), eval_examples, c);
    });
    return values;
  }

  data::DataSplits d_;
  std::vector<std::shared_ptr<models::Model>> models_;
};

TEST(EvaluationSize, FirstNOrTheWholeSplit) {
  EXPECT_EQ(evaluation_size(10000, 0), 10000);
  EXPECT_EQ(evaluation_size(10000, 700), 700);
  EXPECT_EQ(evaluation_size(10000, 10000), 10000);
  EXPECT_EQ(evaluation_size(10, 700), 10);  // past the end: clamped, not refused
  EXPECT_EQ(evaluation_size(0, 700), 0);
}

TEST_F(EvaluationTest, AccuracyOnTheFirstNExamplesOnOneAndTwoRanks) {
  // 0: the whole split; 1001: odd, so the two ranks' shares differ; past the end: clamped.
  for (const int64_t n : {int64_t{0}, int64_t{1001}, int64_t{700}, int64_t{5000}}) {
    const int64_t used = n == 0 || n > kTestExamples ? kTestExamples : n;
    const double want = expected(Metric::kAccuracy, used);
    for (int ranks : {1, 2})
      for (double got : on_ranks(ranks, Metric::kAccuracy, n))
        EXPECT_DOUBLE_EQ(got, want) << "eval_examples " << n << ", " << ranks << " rank(s)";
    EXPECT_DOUBLE_EQ(evaluate_alone(*models_[0], Metric::kAccuracy, *d_.testing(), n), want);
  }
  // The subset is a different sample from the whole split: a test that the limit applies.
  EXPECT_NE(expected(Metric::kAccuracy, 37), expected(Metric::kAccuracy, kTestExamples));
  EXPECT_DOUBLE_EQ(on_ranks(2, Metric::kAccuracy, 37)[0], expected(Metric::kAccuracy, 37));
}

TEST_F(EvaluationTest, LossOnTheFirstNExamplesIsTheirMeanOnOneAndTwoRanks) {
  for (const int64_t n : {int64_t{0}, int64_t{1001}}) {
    const int64_t used = n == 0 ? kTestExamples : n;
    const double want = expected(Metric::kLoss, used);
    for (int ranks : {1, 2})
      for (double got : on_ranks(ranks, Metric::kLoss, n))
        EXPECT_NEAR(got, want, 1e-6 * want) << "eval_examples " << n << ", " << ranks << " rank(s)";
  }
}

}  // namespace
}  // namespace krab::train
