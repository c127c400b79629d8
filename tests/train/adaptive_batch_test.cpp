// train/batch_schedule.h and train/adaptive_batch.h against closed forms: the fixed batch's
// schedule is the step arithmetic the loop used before; segments place every step's
// micro-batches where the ones before end; AdaScale's gain and the goodput-optimal batch
// B* = sqrt(B_noise · a/c) computed by hand; a checkpoint's state round-trips and a corrupt
// one is refused.
#include "train/adaptive_batch.h"

#include <gtest/gtest.h>

#include <cmath>

#include "core/errors.h"
#include "train/batch_schedule.h"

namespace krab::train {
namespace {

TEST(BatchSchedule, AFixedBatchCountsStepsAsTheLoopAlwaysDid) {
  const int64_t accum = 3, steps = 10;
  BatchSchedule s(accum, steps * accum);
  EXPECT_EQ(s.total_units(), steps);
  for (int64_t step = 0; step < steps; ++step) {
    EXPECT_EQ(s.first_micro(step), step * accum);
    EXPECT_EQ(s.micro_batches(step), accum);
    EXPECT_EQ(s.units_before(step), step);
    EXPECT_EQ(s.units_after(step), step + 1);
    EXPECT_EQ(s.last(step), step + 1 == steps);
    for (int64_t every : {1, 4, 5})
      EXPECT_EQ(s.crosses(step, every), (step + 1) % every == 0) << step << " " << every;
  }
}

TEST(BatchSchedule, SegmentsStartWhereTheOnesBeforeEndAndTheLastStepIsCut) {
  BatchSchedule s(1, 20);
  s.append({5, 999, 4, 100});  // first_micro is derived, not taken
  EXPECT_EQ(s.segments().back().first_micro, 5);
  EXPECT_EQ(s.first_micro(4), 4);
  EXPECT_EQ(s.first_micro(5), 5);
  EXPECT_EQ(s.first_micro(7), 13);
  EXPECT_EQ(s.micro_batches(7), 4);
  EXPECT_FALSE(s.last(7));
  EXPECT_EQ(s.micro_batches(8), 3);  // 17..20: what is left
  EXPECT_TRUE(s.last(8));
  EXPECT_TRUE(s.past_end(9));
  EXPECT_FALSE(s.past_end(8));
  EXPECT_EQ(s.micro_batches(9), 4);  // past the end: the segment's count, uncut
  // Evaluation every 10 units: crossed by the step holding micro-batch 10 (step 6: 9..13).
  for (int64_t step = 0; step <= 8; ++step) EXPECT_EQ(s.crosses(step, 10), step == 6 || step == 8);
  EXPECT_THROW(s.append({5, 0, 2, 0}), InvalidArgument);  // not after the last segment
}

TEST(BatchSchedule, RestoreRefusesSegmentsThatAreNotASchedule) {
  BatchSchedule s(1, 100);
  EXPECT_THROW(s.restore({}), InvalidArgument);
  EXPECT_THROW(s.restore({{1, 0, 1, 0}}), InvalidArgument);
  EXPECT_THROW(s.restore({{0, 0, 1, 0}, {4, 5, 2, 0}}), InvalidArgument);  // 4 != 5
  EXPECT_THROW(s.restore({{0, 0, 1, 0}, {4, 4, 0, 0}}), InvalidArgument);
  s.restore({{0, 0, 1, 0}, {4, 4, 2, 7}});
  EXPECT_EQ(s.first_micro(6), 8);
}

TEST(AdaptiveBatch, AdaScaleGainClosedForm) {
  EXPECT_DOUBLE_EQ(adascale_gain(1000, 100, 100), 1.0);
  EXPECT_DOUBLE_EQ(adascale_gain(1000, 100, 400), 11.0 / 3.5);
  EXPECT_DOUBLE_EQ(adascale_gain(0, 100, 400), 1.0);  // unknown noise: no scaling
  // Far below the noise scale the gain is the batch ratio; far above, it saturates.
  EXPECT_NEAR(adascale_gain(1e9, 100, 400), 4.0, 1e-5);
  EXPECT_NEAR(adascale_gain(1, 100, 1e6), 1.01, 1e-5);
}

TEST(AdaptiveBatch, ChoosesTheGoodputOptimalCount) {
  // micro 64, a/c = 256 examples, B_noise = 1024: B* = sqrt(256 · 1024) = 512 = 8 micro-batches.
  AdaptiveBatchOptions o;
  o.micro = 64;
  o.min_micro = 1;
  o.max_micro = 16;
  EXPECT_EQ(choose_micro_batches(o, 1024, 256, 1), 8);
  EXPECT_EQ(choose_micro_batches(o, 1024, 256, 16), 8);
  // From 7 the gain of 8 is 0.4% (k/((16+k)(4+k)) at 8 and 7): not worth a change.
  EXPECT_EQ(choose_micro_batches(o, 1024, 256, 7), 7);
  // Cheap steps or a clean gradient: the smallest batch. Bounded by max.
  EXPECT_EQ(choose_micro_batches(o, 1024, 1, 4), 1);
  EXPECT_EQ(choose_micro_batches(o, 1, 256, 4), 1);
  o.max_micro = 4;
  EXPECT_EQ(choose_micro_batches(o, 1024, 256, 1), 4);
}

TEST(AdaptiveBatch, TheOverheadIsFittedFromTheCountsRun) {
  // A step of k micro-batches of 64 computes in 0.01 + 1e-4 · 64k s (3 and 1 steps measured),
  // and spends 0.005 s outside: a/c = (0.005 + 0.01) / 1e-4 = 150 examples.
  const auto t = [](int k) { return 0.01 + 1e-4 * 64 * k; };
  const auto both = fitted_overhead(64, {0, 3 * t(1), t(2)}, {0, 3, 1}, 0.005);
  ASSERT_TRUE(both);
  EXPECT_NEAR(*both, 150, 1e-6);
  // One count: the line through 0, so a/c = outside / (t / examples).
  const auto one = fitted_overhead(64, {0, 2 * t(1)}, {0, 2}, 0.005);
  ASSERT_TRUE(one);
  EXPECT_NEAR(*one, 0.005 / (t(1) / 64), 1e-9);
  // A fit whose intercept comes out negative (noise) falls back to the line through 0.
  const auto noisy = fitted_overhead(64, {0, 0.001, 0.1}, {0, 1, 1}, 0.005);
  ASSERT_TRUE(noisy);
  EXPECT_NEAR(*noisy, 0.005 / (0.101 / 192), 1e-9);
  EXPECT_FALSE(fitted_overhead(64, {0, 0}, {0, 0}, 0.005));
}

TEST(AdaptiveBatch, TheLearningRateFollowsTheGainOrItsRoot) {
  AdaptiveBatchOptions o;
  o.micro = 100;
  o.max_micro = 8;
  BatchSchedule s(1, 1000);
  AdaptiveBatch sgd(o, s);
  sgd.restore({1, 2, 0, 0, 0, 0, 0, 0, 1, 0, 10, 10, 4, 1000}, "test");
  EXPECT_DOUBLE_EQ(sgd.lr_gain(3), 1.0);
  EXPECT_DOUBLE_EQ(sgd.lr_gain(12), 11.0 / 3.5);
  o.sqrt_gain = true;
  AdaptiveBatch adam(o, s);
  EXPECT_DOUBLE_EQ(adam.lr_gain(12), std::sqrt(11.0 / 3.5));
}

TEST(AdaptiveBatch, StateRoundTripsAndCorruptStateIsRefused) {
  AdaptiveBatchOptions o;
  o.micro = 64;
  o.max_micro = 8;
  BatchSchedule s(1, 1000);
  AdaptiveBatch a(o, s);
  const std::vector<double> state{1, 3,  0.5, 40, 0.9,  30, 0,   0, 1,
                                  0, 25, 25,  4,  80.5, 50, 125, 8, 200};
  a.restore(state, "x");
  EXPECT_EQ(a.save(), state);
  EXPECT_EQ(s.first_micro(60), 125 + 10 * 8);
  const auto refused = [&](std::vector<double> bad) {
    BatchSchedule other(1, 1000);
    AdaptiveBatch b(o, other);
    EXPECT_THROW(b.restore(bad, "x"), CorruptData);
    EXPECT_EQ(other.segments().size(), 1u);  // nothing changed
  };
  auto bad = state;
  bad[0] = 2;  // another version
  refused(bad);
  bad = state;
  bad[1] = 4;  // more segments than numbers
  refused(bad);
  bad = state;
  bad[10] = 25.5;  // a step that is not whole
  refused(bad);
  bad = state;
  bad[16] = 9;  // above this job's largest batch
  refused(bad);
  bad = state;
  bad[15] = 126;  // does not follow the segment before
  refused(bad);
  bad = state;
  bad[2] = std::nan("");
  refused(bad);
  bad = state;
  bad[14] = 1e300;  // would overflow
  refused(bad);
}

}  // namespace
}  // namespace krab::train
