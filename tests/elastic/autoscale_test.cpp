// The autoscale policy (src/elastic/autoscale.h) on synthetic rate curves: a fake step clock
// whose step at W workers takes examples / rate(W) seconds (with seeded noise where said), and a
// provider that carries out each decision a few steps later. Expectations are independent of the
// policy's code: the knee of each curve worked out by hand from the thresholds, and every
// decision re-derived from the measurements the policy exposes with the formula of §8.
#include "elastic/autoscale.h"

#include <gtest/gtest.h>

#include <functional>
#include <random>

#include "core/errors.h"

namespace krab::elastic {
namespace {

constexpr int64_t kExamples = 256;

AutoscaleOptions options(int max_workers) {
  AutoscaleOptions o;
  o.up_efficiency = 0.6;
  o.down_efficiency = 0.3;
  o.window_steps = 20;
  o.cooldown_steps = 60;
  o.max_workers = max_workers;
  o.examples_per_step = kExamples;
  return o;
}

// A run on a fake clock: rate(W, step) examples per second, ±noise relative per step, a decision
// taking effect `join_after` steps later, capacity(step) workers the provider can still start.
struct Clock {
  std::function<double(int, int64_t)> rate;
  double noise = 0;
  uint64_t seed = 1;
  int64_t join_after = 3;
  std::function<int(int64_t)> capacity = [](int64_t) { return 100; };
  int workers = 1;
  std::vector<int> sizes = {};  // the workers of each step, from step 1

  void go(AutoscalePolicy& policy, int64_t steps) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> jitter(-noise, noise);
    double now = 1.8e9;  // Unix seconds
    int64_t change_at = -1;
    int target = workers;
    policy.on_progress(0, now, workers, capacity(0));
    for (int64_t step = 1; step <= steps; ++step) {
      if (step == change_at) workers = target;
      now += static_cast<double>(kExamples) / rate(workers, step) * (1 + jitter(rng));
      sizes.push_back(workers);
      if (const auto d = policy.on_progress(step, now, workers, capacity(step))) {
        change_at = step + join_after;
        target = d->to;
      }
    }
  }
};

std::function<double(int, int64_t)> curve(std::vector<double> rates) {
  return [rates](int w, int64_t) { return rates.at(static_cast<size_t>(w - 1)); };
}

// The decisions as (action, from, to), for comparing with a list written by hand.
std::vector<std::tuple<ScaleAction, int, int>> moves(const AutoscalePolicy& p) {
  std::vector<std::tuple<ScaleAction, int, int>> out;
  for (const ScaleDecision& d : p.decisions()) out.emplace_back(d.action, d.from, d.to);
  return out;
}

constexpr auto kAdd = ScaleAction::kAdd;
constexpr auto kRemove = ScaleAction::kRemove;

// Every decision again, from measurements() alone: the latest window of `from` and of `from − 1`
// at or before the decision's step, e = (r_W − r_{W−1}) / (r_{W−1} / (W − 1)), and the rule.
void expect_rederivable(const AutoscalePolicy& p, const AutoscaleOptions& o) {
  for (const ScaleDecision& d : p.decisions()) {
    SCOPED_TRACE(testing::Message()
                 << to_string(d.action) << " at step " << d.step << ": " << d.reason);
    std::optional<double> at, below;
    for (const SizeRate& m : p.measurements()) {
      if (m.step > d.step) break;
      if (m.workers == d.from) at = m.rate;
      if (m.workers == d.from - 1) below = m.rate;
    }
    ASSERT_TRUE(at.has_value());
    EXPECT_EQ(d.rate, *at);
    EXPECT_EQ(d.rate_below, below);
    std::optional<double> e;
    if (below) e = (*at - *below) / (*below / (d.from - 1));
    ASSERT_EQ(d.efficiency.has_value(), e.has_value());
    if (e) {
      EXPECT_DOUBLE_EQ(*d.efficiency, *e);
    }
    if (d.action == kAdd) {
      EXPECT_EQ(d.to, d.from + 1);
      EXPECT_LT(d.from, o.max_workers);
      if (e) {
        EXPECT_GE(*e, o.up_efficiency);
      }
    } else {
      EXPECT_EQ(d.to, d.from - 1);
      ASSERT_TRUE(e.has_value());
      EXPECT_LT(*e, o.down_efficiency);
    }
  }
  for (const SizeRate& m : p.measurements())
    EXPECT_DOUBLE_EQ(m.rate * m.median_step_s, static_cast<double>(kExamples));
}

TEST(Autoscale, SettlesAtTheKnee) {
  // 100, 190, 200, 205 for W = 1..4: e_2 = 90 / 100 = 0.9 (add), e_3 = 10 / 95 = 0.105 (below
  // 0.3: remove), so the run goes 1 -> 2 -> 3 -> 2 and stays, 3 being bad at the same rate.
  const auto o = options(4);
  AutoscalePolicy policy(o);
  Clock run{curve({100, 190, 200, 205})};
  run.go(policy, 1000);
  EXPECT_EQ(moves(policy), (std::vector<std::tuple<ScaleAction, int, int>>{
                               {kAdd, 1, 2}, {kAdd, 2, 3}, {kRemove, 3, 2}}));
  EXPECT_EQ(run.workers, 2);
  EXPECT_TRUE(policy.settled());
  // Unix seconds near 1.8e9 in a double are good to about 0.2 µs: rates to ~1e-6 relative.
  EXPECT_NEAR(policy.rate(1)->rate, 100, 1e-4);
  EXPECT_NEAR(policy.rate(2)->rate, 190, 1e-4);
  EXPECT_NEAR(policy.rate(3)->rate, 200, 1e-4);
  EXPECT_FALSE(policy.rate(4).has_value());
  EXPECT_NEAR(*policy.decisions()[2].efficiency, 10.0 / 95, 1e-5);
  expect_rederivable(policy, o);
  // The first decision needs the warm-up and one window: step 5 + 20.
  EXPECT_EQ(policy.decisions()[0].step, kAutoscaleWarmupSteps + o.window_steps);
}

TEST(Autoscale, TenPercentNoiseDoesNotFlap) {
  // Uniform ±10% on every step time: a window's median moves a few percent, far from what would
  // change a decision (e_2 ≈ 0.9 ± 0.1, e_3 ≈ 0.1 ± 0.13, rate_2 within 20% of its reference).
  for (uint64_t seed : {1, 2, 3, 4, 5}) {
    SCOPED_TRACE(testing::Message() << "seed " << seed);
    const auto o = options(4);
    AutoscalePolicy policy(o);
    Clock run{curve({100, 190, 200, 205}), 0.10, seed};
    run.go(policy, 1000);
    EXPECT_EQ(moves(policy), (std::vector<std::tuple<ScaleAction, int, int>>{
                                 {kAdd, 1, 2}, {kAdd, 2, 3}, {kRemove, 3, 2}}));
    EXPECT_EQ(run.workers, 2);
    EXPECT_TRUE(policy.settled());
    EXPECT_GT(policy.measurements().size(), 40u);  // it kept measuring all along
    int changes = 0;  // of the world, step by step: the three decisions and nothing else
    for (size_t i = 1; i < run.sizes.size(); ++i) changes += run.sizes[i] != run.sizes[i - 1];
    EXPECT_EQ(changes, 3);
    expect_rederivable(policy, o);
  }
}

TEST(Autoscale, ALinearCurveGoesAllTheWayToMaxWorkers) {
  const auto o = options(6);
  AutoscalePolicy policy(o);
  Clock run{[](int w, int64_t) { return 100.0 * w; }, 0.05};
  run.go(policy, 1000);
  EXPECT_EQ(run.workers, 6);
  ASSERT_EQ(policy.decisions().size(), 5u);
  for (const ScaleDecision& d : policy.decisions()) EXPECT_EQ(d.action, kAdd);
  EXPECT_TRUE(policy.settled());
  expect_rederivable(policy, o);
}

TEST(Autoscale, RespectsMaxWorkersAndCapacity) {
  const auto linear = [](int w, int64_t) { return 100.0 * w; };
  {
    AutoscalePolicy policy(options(3));
    Clock run{linear};
    run.go(policy, 600);
    EXPECT_EQ(run.workers, 3);
    EXPECT_EQ(policy.decisions().size(), 2u);
    EXPECT_TRUE(policy.settled());
  }
  {
    // No capacity at all: nothing is ever decided, and the run settles at 1.
    AutoscalePolicy policy(options(8));
    Clock run{linear};
    run.capacity = [](int64_t) { return 0; };
    run.go(policy, 600);
    EXPECT_EQ(run.workers, 1);
    EXPECT_TRUE(policy.decisions().empty());
    EXPECT_TRUE(policy.settled());
  }
  {
    // Capacity runs out at step 40, after the first addition.
    AutoscalePolicy policy(options(8));
    Clock run{linear};
    run.capacity = [](int64_t step) { return step < 40 ? 1 : 0; };
    run.go(policy, 600);
    EXPECT_EQ(run.workers, 2);
    EXPECT_EQ(policy.decisions().size(), 1u);
  }
}

TEST(Autoscale, NeverReAddsABadSizeWithinCooldownOrWhileTheRateStands) {
  // The knee of SettlesAtTheKnee with a long cooldown: after the removal nothing is decided for
  // 200 steps; then, with rate_2 unchanged, 3 is not tried again.
  auto o = options(4);
  o.cooldown_steps = 200;
  AutoscalePolicy policy(o);
  Clock run{curve({100, 190, 200, 205})};
  run.go(policy, 1000);
  ASSERT_EQ(policy.decisions().size(), 3u);
  EXPECT_EQ(run.workers, 2);
  // Rate_2 moves by 10% at step 500 (within the band): still nothing.
  AutoscalePolicy drift(o);
  Clock small{[](int w, int64_t step) {
    const double r[] = {100, 190, 200, 205};
    return r[w - 1] * (step >= 500 ? 1.1 : 1.0);
  }};
  small.go(drift, 1000);
  EXPECT_EQ(drift.decisions().size(), 3u);
  EXPECT_EQ(small.workers, 2);
}

TEST(Autoscale, ABadSizeIsTriedAgainOnceTheRateMovedByMoreThanTwentyPercent) {
  // From step 90 (just after 3 was removed at step 81) the machine is twice as fast beyond one
  // worker: 100, 380, 570, 600. Rate_2 moves 100% past its reference 190, e_2 = 2.8, so 3 is
  // added again — not before the cooldown is over; e_3 = 190 / 190 = 1.0 adds 4, and
  // e_4 = 30 / 190 = 0.16 removes it: the run ends at 3.
  const auto o = options(4);
  AutoscalePolicy policy(o);
  Clock run{[](int w, int64_t step) {
    const double before[] = {100, 190, 200, 205}, after[] = {100, 380, 570, 600};
    return step >= 90 ? after[w - 1] : before[w - 1];
  }};
  run.go(policy, 1000);
  EXPECT_EQ(moves(policy), (std::vector<std::tuple<ScaleAction, int, int>>{{kAdd, 1, 2},
                                                                           {kAdd, 2, 3},
                                                                           {kRemove, 3, 2},
                                                                           {kAdd, 2, 3},
                                                                           {kAdd, 3, 4},
                                                                           {kRemove, 4, 3}}));
  EXPECT_EQ(run.workers, 3);
  EXPECT_EQ(policy.decisions()[2].step, 81);
  EXPECT_EQ(policy.decisions()[3].step, policy.decisions()[2].step + o.cooldown_steps);
  expect_rederivable(policy, o);
}

// A loaded machine: the rate at 2 workers swings by 40% every 50 steps, so 3 (never worth it)
// passes the 20% test after each cooldown. It is tried again once (kBadSizeRetries), found bad a
// second time, and never added again: the run settles at 2.
TEST(Autoscale, ASizeFoundBadTwiceIsNeverTriedAgain) {
  const auto o = options(4);
  AutoscalePolicy policy(o);
  Clock run{[](int w, int64_t step) {
    const double swing = (step / 50) % 2 == 0 ? 1.0 : 1.4;
    const double rates[] = {100, 190 * swing, 200 * swing, 205 * swing};
    return rates[w - 1];
  }};
  run.go(policy, 2000);
  int adds_of_3 = 0;
  for (const ScaleDecision& d : policy.decisions()) adds_of_3 += d.action == kAdd && d.to == 3;
  EXPECT_EQ(adds_of_3, 1 + kBadSizeRetries);
  EXPECT_EQ(run.workers, 2);
  EXPECT_TRUE(policy.settled());
  EXPECT_LT(policy.decisions().back().step, 1000);
  expect_rederivable(policy, o);
}

// While a joiner starts (the decision pending, the world not changed yet) the machine is shared
// and the old size runs at half speed. Those steps must not become the old size's rate: with
// 1, 2, 3 workers at 100, 190, 200 the third addition must still be judged against 190 (e 0.1:
// removed), not against the ~95 of the slowed windows (which would make 3 look like e 1.1).
TEST(Autoscale, StepsWhileADecisionIsPendingMeasureNothing) {
  const auto o = options(4);
  AutoscalePolicy policy(o);
  Clock run{curve({100, 190, 200, 205})};
  run.join_after = 40;  // a slow joiner: two windows pass at the old size
  run.rate = [&policy](int w, int64_t) {
    const double rates[] = {100, 190, 200, 205};
    return policy.pending() ? rates[w - 1] / 2 : rates[w - 1];
  };
  run.go(policy, 600);
  EXPECT_EQ(moves(policy), (std::vector<std::tuple<ScaleAction, int, int>>{
                               {kAdd, 1, 2}, {kAdd, 2, 3}, {kRemove, 3, 2}}));
  EXPECT_EQ(run.workers, 2);
  for (const SizeRate& m : policy.measurements()) {
    const double want = (std::vector<double>{100, 190, 200, 205})[m.workers - 1];
    EXPECT_NEAR(m.rate, want, want * 1e-6) << m.workers << " workers at step " << m.step;
  }
  expect_rederivable(policy, o);
}

TEST(Autoscale, BetweenTheThresholdsNothingMoves) {
  // e_3 = (233 − 190) / 95 = 0.45: neither worth another worker nor bad enough to remove one.
  const auto o = options(4);
  AutoscalePolicy policy(o);
  Clock run{curve({100, 190, 233, 240})};
  run.go(policy, 1000);
  EXPECT_EQ(moves(policy),
            (std::vector<std::tuple<ScaleAction, int, int>>{{kAdd, 1, 2}, {kAdd, 2, 3}}));
  EXPECT_EQ(run.workers, 3);
  EXPECT_TRUE(policy.settled());
  EXPECT_NEAR(*policy.efficiency(3), 43.0 / 95, 1e-5);
}

TEST(Autoscale, RateIsTheBatchOverTheMedianStepAfterWarmUp) {
  // Window 5: steps 1..5 are warm-up (10 s each: ignored), then 0.5 s steps with one of 4 s;
  // the median ignores it. A record that covers two steps gives each half its interval.
  auto o = options(2);
  o.window_steps = 5;
  AutoscalePolicy policy(o);
  double now = 0;
  policy.on_progress(0, now, 1, 0);
  for (int64_t s = 1; s <= 5; ++s) policy.on_progress(s, now += 10, 1, 0);
  policy.on_progress(6, now += 0.5, 1, 0);
  policy.on_progress(7, now += 4, 1, 0);
  policy.on_progress(9, now += 1.0, 1, 0);  // steps 8 and 9: 0.5 s each
  EXPECT_TRUE(policy.measurements().empty());
  policy.on_progress(10, now += 0.5, 1, 0);
  ASSERT_EQ(policy.measurements().size(), 1u);
  EXPECT_EQ(policy.measurements()[0].step, 10);
  EXPECT_DOUBLE_EQ(policy.measurements()[0].median_step_s, 0.5);
  EXPECT_DOUBLE_EQ(policy.measurements()[0].rate, kExamples / 0.5);
  // A retried step and a clock stepped back measure nothing.
  policy.on_progress(10, now += 7, 1, 0);
  policy.on_progress(11, now -= 3, 1, 0);
  for (int64_t s = 12; s <= 16; ++s) policy.on_progress(s, now += 0.25, 1, 0);
  ASSERT_EQ(policy.measurements().size(), 2u);
  EXPECT_DOUBLE_EQ(policy.measurements()[1].median_step_s, 0.25);
}

TEST(Autoscale, AFailedProposalIsDroppedAndCoolsDown) {
  auto o = options(4);
  AutoscalePolicy policy(o);
  double now = 0;
  std::optional<ScaleDecision> d;
  int64_t s = 0;
  for (; !d; ++s) d = policy.on_progress(s, now += 1, 1, 1);
  EXPECT_TRUE(policy.pending());
  EXPECT_FALSE(policy.settled());
  // Pending: nothing more is decided at the same size.
  for (int i = 0; i < 30; ++i) EXPECT_FALSE(policy.on_progress(s++, now += 1, 1, 1));
  policy.proposal_failed(s);
  EXPECT_FALSE(policy.pending());
  const int64_t failed_at = s;
  for (; s < failed_at + o.cooldown_steps; ++s) EXPECT_FALSE(policy.on_progress(s, now += 1, 1, 1));
  EXPECT_TRUE(policy.on_progress(s, now += 1, 1, 1).has_value());
}

TEST(Autoscale, RefusesOptionsByKey) {
  const auto refused = [](const std::function<void(AutoscaleOptions&)>& change, const char* key) {
    AutoscaleOptions o = options(4);
    change(o);
    try {
      AutoscalePolicy policy(o);
      ADD_FAILURE() << "accepted, expected a refusal naming " << key;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
    }
  };
  refused([](AutoscaleOptions& o) { o.down_efficiency = 0.7; },
          "elastic.autoscale.down_efficiency");
  refused([](AutoscaleOptions& o) { o.up_efficiency = NAN; }, "elastic.autoscale.up_efficiency");
  refused([](AutoscaleOptions& o) { o.window_steps = 0; }, "elastic.autoscale.window_steps");
  refused([](AutoscaleOptions& o) { o.cooldown_steps = -1; }, "elastic.autoscale.cooldown_steps");
  refused([](AutoscaleOptions& o) { o.min_workers = 5; }, "elastic.max_workers");
  refused([](AutoscaleOptions& o) { o.min_workers = 0; }, "elastic.min_workers");
  refused([](AutoscaleOptions& o) { o.examples_per_step = 0; }, "examples per step");
  AutoscalePolicy ok(options(4));
  EXPECT_THROW(ok.on_progress(0, 0, 0, 1), InvalidArgument);
}

}  // namespace
}  // namespace krab::elastic
