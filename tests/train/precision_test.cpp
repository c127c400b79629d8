// train.precision (train/precision.h): the autocast guard's effect and its undoing, bf16
// training on gpt and cnn, activation checkpointing under bf16, and the error that names the
// key when autocast cannot run a model.
#include "train/precision.h"

#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "core/errors.h"
#include "models/model.h"
#include "models/recompute.h"

namespace krab::train {
namespace {

models::ModelSpec gpt_spec() {
  models::ModelSpec s;
  s.name = "gpt";
  s.input_shape = {16};
  s.num_classes = 32;
  s.layers = 2;
  s.width = 32;
  s.heads = 4;
  s.context = 16;
  return s;
}

models::ModelSpec cnn_spec() {
  models::ModelSpec s;
  s.name = "cnn";
  s.input_shape = {1, 12, 12};
  return s;
}

std::pair<at::Tensor, at::Tensor> batch_for(const models::ModelSpec& spec) {
  torch::manual_seed(5);
  if (spec.name == "gpt")
    return {torch::randint(0, spec.num_classes, {8, 16}, torch::kInt64),
            torch::randint(0, spec.num_classes, {8, 16}, torch::kInt64)};
  return {torch::randn({8, 1, 12, 12}), torch::randint(0, spec.num_classes, {8}, torch::kInt64)};
}

std::shared_ptr<models::Model> build(const models::ModelSpec& spec) {
  torch::manual_seed(0);
  return models::make_model(spec);
}

class PrecisionTest : public ::testing::Test {
 protected:
  void SetUp() override { torch::set_num_threads(1); }
};

TEST_F(PrecisionTest, NamesParseAndABadOneNamesTheKey) {
  EXPECT_EQ(parse_precision("fp32"), Precision::kFp32);
  EXPECT_EQ(parse_precision("bf16"), Precision::kBf16);
  EXPECT_STREQ(precision_name(Precision::kBf16), "bf16");
  try {
    parse_precision("fp16");
    ADD_FAILURE() << "fp16 accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("train.precision"), std::string::npos) << e.what();
  }
}

// The guard's effect is observable: under bf16 both models' logits (a linear's output) are
// bf16 and the loss is fp32 (autocast's fp32 list); under fp32, or after the guard, nothing
// is autocast and the thread's autocast state is what it was.
TEST_F(PrecisionTest, Bf16GuardMakesLogitsBf16AndUndoesItself) {
  for (const auto& spec : {gpt_spec(), cnn_spec()}) {
    SCOPED_TRACE(spec.name);
    auto model = build(spec);
    const auto [x, y] = batch_for(spec);
    {
      AutocastGuard guard(Precision::kBf16);
      const at::Tensor logits = model->forward(x);
      EXPECT_EQ(logits.scalar_type(), at::kBFloat16);
      EXPECT_EQ(model->loss(logits, y).scalar_type(), at::kFloat);
    }
    EXPECT_FALSE(at::autocast::is_cpu_enabled());
    {
      AutocastGuard guard(Precision::kFp32);
      EXPECT_EQ(model->forward(x).scalar_type(), at::kFloat);
    }
    EXPECT_EQ(model->forward(x).scalar_type(), at::kFloat);
  }
}

// bf16 trains: 20 Adam steps on one batch take the loss well down, the gradients the optimizer
// sees are fp32, and they are near (but not equal to) the fp32 gradients — the forward really
// ran in bf16.
TEST_F(PrecisionTest, Bf16TrainsGptAndCnn) {
  for (const auto& spec : {gpt_spec(), cnn_spec()}) {
    SCOPED_TRACE(spec.name);
    const auto [x, y] = batch_for(spec);
    auto fp32 = build(spec);
    fp32->loss(fp32->forward(x), y).backward();

    auto model = build(spec);
    torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(1e-2));
    double first = 0, last = 0;
    for (int step = 0; step < 20; ++step) {
      adam.zero_grad();
      at::Tensor loss;
      {
        AutocastGuard guard(Precision::kBf16);
        loss = model->loss(model->forward(x), y);
      }
      loss.backward();
      if (step == 0) {
        first = loss.item<double>();
        auto reference = fp32->named_parameters();
        for (const auto& item : model->named_parameters()) {
          const at::Tensor g = item.value().grad(), want = reference[item.key()].grad();
          EXPECT_EQ(g.scalar_type(), at::kFloat) << item.key();
          const double rel = (g - want).norm().item<double>() / want.norm().item<double>();
          // A sanity bound (the same direction), not a precision claim: the first conv's
          // gradient sums many bf16-rounded products with cancellation (measured 0.08).
          EXPECT_LT(rel, 0.2) << item.key();
        }
        int differ = 0;
        for (const auto& item : model->named_parameters())
          differ += !torch::equal(item.value().grad(), reference[item.key()].grad());
        EXPECT_GT(differ, 0) << "bf16 gradients equal to fp32's: autocast did not apply";
      }
      last = loss.item<double>();
      adam.step();
    }
    EXPECT_LT(last, 0.5 * first) << "first " << first << ", last " << last;
  }
}

// Checkpointing restores the forward's autocast state for the recompute: under bf16 the
// gradients with every unit recomputed are bit-identical to the plain bf16 gradients.
TEST_F(PrecisionTest, RecomputeUnderBf16GivesTheSameGradients) {
  for (const auto& spec : {gpt_spec(), cnn_spec()}) {
    SCOPED_TRACE(spec.name);
    const auto [x, y] = batch_for(spec);
    auto plain = build(spec), recomputed = build(spec);
    models::RecomputeRunner runner(*recomputed);
    runner.install(*recomputed);
    for (auto* m : {plain.get(), recomputed.get()}) {
      for (int micro = 0; micro < 2; ++micro) {
        at::Tensor loss;
        {
          AutocastGuard guard(Precision::kBf16);
          loss = m->loss(m->forward(x), y);
        }
        loss.backward();
      }
    }
    const auto a = plain->named_parameters(), b = recomputed->named_parameters();
    for (const auto& item : a) {
      ASSERT_TRUE(item.value().grad().defined()) << item.key();
      EXPECT_TRUE(torch::equal(item.value().grad(), b[item.key()].grad())) << item.key();
    }
  }
}

// LibTorch 1.13's limit (design §12 check 6): layer_norm of a bf16 activation with fp32
// weights throws. The first step's error is one line naming train.precision, an
// InvalidArgument (exit 2, like any model that cannot run the job); under fp32 the same step
// runs; krab's own errors pass through unchanged.
TEST_F(PrecisionTest, AForwardAutocastCannotRunIsReportedNamingTheKey) {
  torch::nn::Linear linear(8, 8);
  torch::nn::LayerNorm norm(torch::nn::LayerNormOptions({8}));
  const at::Tensor x = torch::randn({4, 8});
  Precision precision = Precision::kBf16;
  auto step = [&] {
    AutocastGuard guard(precision);
    norm->forward(linear->forward(x)).sum().backward();
  };
  try {
    explain_precision_failure(precision, step);
    ADD_FAILURE() << "post-LN forward ran under bf16 autocast";
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("train.precision: bf16"), std::string::npos) << what;
    EXPECT_NE(what.find("expected scalar type BFloat16"), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << "one line: " << what;
  }
  precision = Precision::kFp32;
  EXPECT_NO_THROW(explain_precision_failure(precision, step));
  EXPECT_THROW(explain_precision_failure(Precision::kBf16, [] { throw Timeout("t"); }), Timeout);
}

}  // namespace
}  // namespace krab::train
