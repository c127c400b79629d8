// The load balancer (elastic::rebalance, src/elastic/slices.h) against expectations computed
// another way: the closed form of a line through two points (the fit), an enumeration of every
// integer split within the bounds (the plan is the minimax split of its model), and a simulated
// cluster whose step time is n_r · c + delay_r (how many moves, and where they end, against the
// best split found by enumeration).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>

#include "core/errors.h"
#include "elastic/slices.h"

namespace krab::elastic {
namespace {

// ---- a simulated cluster: step time of rank r = n_r · per_example + delay_r (µs) ----

struct Cluster {
  int64_t per_example = 0;
  std::vector<int64_t> delay;
  std::vector<int64_t> times(const std::vector<int64_t>& sizes) const {
    std::vector<int64_t> t;
    for (size_t r = 0; r < sizes.size(); ++r) t.push_back(sizes[r] * per_example + delay[r]);
    return t;
  }
  int64_t step(const std::vector<int64_t>& sizes) const {
    const auto t = times(sizes);
    return *std::max_element(t.begin(), t.end());
  }
};

// Every split of `total` with lo_r <= n_r <= hi_r, handed to `visit`.
void for_each_split(int64_t total, const std::vector<int64_t>& lo, const std::vector<int64_t>& hi,
                    const std::function<void(const std::vector<int64_t>&)>& visit) {
  std::vector<int64_t> n(lo.size());
  std::function<void(size_t, int64_t)> walk = [&](size_t r, int64_t left) {
    if (r + 1 == n.size()) {
      if (left >= lo[r] && left <= hi[r]) {
        n[r] = left;
        visit(n);
      }
      return;
    }
    for (int64_t v = lo[r]; v <= std::min(hi[r], left); ++v) {
      n[r] = v;
      walk(r + 1, left - v);
    }
  };
  walk(0, total);
}

// The least step time of any split of B among the cluster's ranks (n_r >= 1), by enumeration.
int64_t best_step_by_enumeration(const Cluster& cluster, int64_t total) {
  const size_t world = cluster.delay.size();
  int64_t best = -1;
  for_each_split(total, std::vector<int64_t>(world, 1), std::vector<int64_t>(world, total),
                 [&](const std::vector<int64_t>& n) {
                   const int64_t t = cluster.step(n);
                   if (best < 0 || t < best) best = t;
                 });
  return best;
}

// One rebalance must keep Σ = B, every n_r >= 1 and every move within floor(max_change · B/W).
void expect_within_bounds(const std::vector<int64_t>& before, const std::vector<int64_t>& after,
                          double max_change) {
  ASSERT_EQ(after.size(), before.size());
  const int64_t total = std::accumulate(before.begin(), before.end(), int64_t{0});
  EXPECT_EQ(std::accumulate(after.begin(), after.end(), int64_t{0}), total);
  const double bound = max_change * static_cast<double>(total) / static_cast<double>(before.size());
  for (size_t r = 0; r < before.size(); ++r) {
    EXPECT_GE(after[r], 1) << "rank " << r;
    EXPECT_LE(static_cast<double>(std::abs(after[r] - before[r])), bound) << "rank " << r;
  }
}

// Rebalances as DataParallelSteps does (the history of one passed to the next) until the
// balancer keeps the sizes, at most `limit` changes, checking the bounds of every move and that
// every change lowers the simulated step time; returns the changes made.
int settle(std::vector<int64_t>& sizes, const Cluster& cluster, double max_change, int limit) {
  BalanceHistory history;
  int changes = 0;
  for (; changes <= limit; ++changes) {
    const Rebalance next = rebalance(sizes, cluster.times(sizes), max_change, history);
    expect_within_bounds(sizes, next.sizes, max_change);
    history = next.history;
    if (!next.changed) break;
    EXPECT_LT(cluster.step(next.sizes), cluster.step(sizes)) << testing::PrintToString(next.sizes);
    sizes = next.sizes;
  }
  return changes;
}

TEST(Balance, FitRecoversAFixedCostAndACostPerExampleFromTwoWindows) {
  std::mt19937_64 rng(5);
  for (int trial = 0; trial < 1000; ++trial) {
    const auto a = static_cast<int64_t>(rng() % 200'000);
    const auto c = 1 + static_cast<int64_t>(rng() % 10'000);
    const auto n = 1 + static_cast<int64_t>(rng() % 64);
    auto earlier = 1 + static_cast<int64_t>(rng() % 64);
    if (earlier == n) ++earlier;
    // The share of per-example work must clear the floor for the line to be taken as it is.
    if (static_cast<double>(c) < kMinSlopeShare * static_cast<double>(a + c * n) / n) continue;
    const StepTimeModel m = fit_step_time(n, a + c * n, earlier, a + c * earlier);
    EXPECT_NEAR(m.per_example_us, static_cast<double>(c), 1e-9 * static_cast<double>(c));
    EXPECT_NEAR(m.fixed_us, static_cast<double>(a), 1e-6 * static_cast<double>(a + c * n));
  }
  // One size measured (or none before): the n/t rule, all of the time per example.
  for (const StepTimeModel& m :
       {fit_step_time(16, 80'000, 16, 70'000), fit_step_time(16, 80'000, 0, 0)}) {
    EXPECT_EQ(m.fixed_us, 0.0);
    EXPECT_EQ(m.per_example_us, 5'000.0);
  }
  // Time fell as the slice grew (noise): the slope is floored, and the line still passes through
  // the latest window.
  const StepTimeModel flat = fit_step_time(20, 100'000, 16, 104'000);
  EXPECT_DOUBLE_EQ(flat.per_example_us, kMinSlopeShare * 100'000 / 20);
  EXPECT_DOUBLE_EQ(flat.at(20), 100'000);
  // Time grew faster than in proportion (no fixed cost can explain it): the n/t rule.
  const StepTimeModel steep = fit_step_time(20, 100'000, 16, 40'000);
  EXPECT_EQ(steep.fixed_us, 0.0);
  EXPECT_EQ(steep.per_example_us, 5'000.0);
  // A 0 µs window counts as 1 µs.
  EXPECT_EQ(fit_step_time(4, 0, 0, 0).per_example_us, 0.25);
}

TEST(Balance, EveryFitPassesThroughTheLatestWindowWithPositiveCosts) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 2000; ++trial) {
    const auto n = 1 + static_cast<int64_t>(rng() % 64);
    const auto t = static_cast<int64_t>(rng() % 300'000);
    const auto earlier = static_cast<int64_t>(rng() % 65);
    const StepTimeModel m = fit_step_time(n, t, earlier, static_cast<int64_t>(rng() % 300'000));
    EXPECT_GT(m.per_example_us, 0.0);
    EXPECT_GE(m.fixed_us, 0.0);
    const double measured = static_cast<double>(std::max<int64_t>(t, 1));
    EXPECT_NEAR(m.at(static_cast<double>(n)), measured, 1e-9 * measured);
  }
}

// The issue's straggler (§5.3): 4 ranks, B = 64, one rank with a fixed 150 ms per step beside
// 100 ms of compute per 16 examples. The delay alone exceeds a fast rank's step, so the best split
// gives the straggler 1 example (21/21/21/1). With the fit, the moves are as few as the bound m
// allows: 15 examples to shed take ceil(15 / m) bounded moves, except that the first move has
// one window only (the n/t rule) and undershoots when the bound does not hold it back.
TEST(Balance, TheIssuesStragglerLandsInTheFewestMovesTheBoundAllows) {
  const Cluster cluster{6250, {0, 0, 0, 150'000}};
  for (const auto& [max_change, moves] :
       std::vector<std::pair<double, int>>{
           {0.25, 4},  // m = 4: 16 -> 12 -> 8 -> 4 -> 1 (the n/t rule alone took 7)
           {0.5, 2},   // m = 8: 16 -> 8 -> 1
           {1.0, 2}})  // m = 16: n/t stops at 7 (it reads the delay as slow work), then 1
  {
    SCOPED_TRACE(testing::Message() << "max_change " << max_change);
    std::vector<int64_t> sizes = equal_sizes(64, 4);
    EXPECT_EQ(settle(sizes, cluster, max_change, 10), moves);
    EXPECT_EQ(sizes, (std::vector<int64_t>{21, 21, 21, 1}));
    EXPECT_EQ(cluster.step(sizes), best_step_by_enumeration(cluster, 64));
  }
  // Where the delay dwarfs the compute (6 ms per 16 examples), the best split saves only 3.6% of
  // the 156 ms step, under kMinGain. The first move, on one window, reads the delay as slow work
  // and is made; the fit that follows sees the truth and moves nothing more.
  const Cluster delay_bound{375, {0, 0, 0, 150'000}};
  for (double max_change : {0.25, 0.5, 1.0}) {
    SCOPED_TRACE(testing::Message() << "6 ms, max_change " << max_change);
    std::vector<int64_t> sizes = equal_sizes(64, 4);
    EXPECT_EQ(settle(sizes, delay_bound, max_change, 10), 1);
    const auto settled = static_cast<double>(delay_bound.step(sizes));
    EXPECT_LT((settled - static_cast<double>(best_step_by_enumeration(delay_bound, 64))) / settled,
              kMinGain);
  }
}

TEST(Balance, FixedDelaysSettleWithinTheMinimumGainOfTheBestSplit) {
  // Any delay (in examples' time, 0..40) on the first or the last rank, three bounds: the
  // balancer settles in at most one move more than the bound requires of the slow slice, at a
  // step time no more than kMinGain above the best split's (found by enumeration) — past that
  // point a move is not worth making.
  const int64_t c = 1000;
  for (int slow : {0, 3}) {
    for (int64_t d = 0; d <= 40; d += 4) {
      Cluster cluster{c, {0, 0, 0, 0}};
      cluster.delay[static_cast<size_t>(slow)] = d * c;
      int64_t best = -1, best_slow = 64;  // the best step, and the largest slow slice giving it
      for_each_split(64, {1, 1, 1, 1}, {64, 64, 64, 64}, [&](const std::vector<int64_t>& n) {
        const int64_t t = cluster.step(n);
        const int64_t mine = n[static_cast<size_t>(slow)];
        if (best < 0 || t < best || (t == best && mine > best_slow)) best_slow = mine;
        if (best < 0 || t < best) best = t;
      });
      for (double max_change : {0.25, 0.5, 1.0}) {
        SCOPED_TRACE(testing::Message()
                     << "slow " << slow << " delay " << d << " max_change " << max_change);
        const auto m = static_cast<int64_t>(max_change * 16);
        const int64_t needed = (16 - best_slow + m - 1) / m;
        std::vector<int64_t> sizes = equal_sizes(64, 4);
        EXPECT_LE(settle(sizes, cluster, max_change, 12), needed + 1)
            << testing::PrintToString(sizes);
        const auto settled = static_cast<double>(cluster.step(sizes));
        EXPECT_LT((settled - static_cast<double>(best)) / settled, kMinGain)
            << testing::PrintToString(sizes) << " vs best " << best;
      }
    }
  }
}

TEST(Balance, EachPlanIsTheMinimaxSplitOfItsModelByEnumeration) {
  // Random worlds, sizes, windows and histories (linear clusters half the time, anything the
  // other half): the plan's predicted step time is the least over every split within the bounds,
  // and it is made exactly when that least time gains kMinGain.
  std::mt19937_64 rng(19);
  int made = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const int world = 1 + static_cast<int>(rng() % 4);
    std::vector<int64_t> sizes, times;
    BalanceHistory history;
    const bool linear = trial % 2 == 0;
    for (int r = 0; r < world; ++r) {
      const int64_t a = static_cast<int64_t>(rng() % 50'000),
                    c = 500 + static_cast<int64_t>(rng() % 5'000);
      sizes.push_back(1 + static_cast<int64_t>(rng() % 8));
      history.sizes.push_back(1 + static_cast<int64_t>(rng() % 8));
      times.push_back(linear ? a + c * sizes.back() : static_cast<int64_t>(rng() % 100'000));
      history.compute_us.push_back(linear ? a + c * history.sizes.back()
                                          : static_cast<int64_t>(rng() % 100'000));
    }
    const double max_change = static_cast<double>(rng() % 101) / 100;
    const Rebalance plan = rebalance(sizes, times, max_change, history);
    SCOPED_TRACE(testing::Message() << testing::PrintToString(sizes) << " "
                                    << testing::PrintToString(times) << " " << max_change);
    const int64_t total = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
    const auto m =
        static_cast<int64_t>(std::floor(max_change * static_cast<double>(total) / world));
    std::vector<int64_t> lo, hi;
    for (int64_t n : sizes) {
      lo.push_back(std::max<int64_t>(1, n - m));
      hi.push_back(n + m);
    }
    const auto predicted = [&](const std::vector<int64_t>& n) {
      double t = 0;
      for (size_t r = 0; r < n.size(); ++r)
        t = std::max(t, plan.model[r].at(static_cast<double>(n[r])));
      return t;
    };
    double best = predicted(sizes);
    for_each_split(total, lo, hi,
                   [&](const std::vector<int64_t>& n) { best = std::min(best, predicted(n)); });
    const double now =
        static_cast<double>(std::max<int64_t>(1, *std::max_element(times.begin(), times.end())));
    const double gain = (now - best) / now;
    if (gain >= kMinGain + 1e-9) {
      EXPECT_TRUE(plan.changed);
      EXPECT_NEAR(predicted(plan.sizes), best, 1e-9 * now);
      ++made;
    } else if (gain < kMinGain - 1e-9) {
      EXPECT_FALSE(plan.changed);
    }
  }
  EXPECT_GT(made, 100);  // the cases exercise the plan, not only the refusal to move
}

TEST(Balance, TheHistoryKeepsEachRanksLatestWindowAtAnotherSize) {
  // Rank 0 moves (its history becomes the window just measured), rank 1 stays at 8 with a history
  // at 12 (kept: its fit needs it), rank 2 stays at 8 with a history at 8 (replaced by the
  // fresher window). Times: rank 0 is slow per example, so it sheds examples.
  const BalanceHistory before{{10, 12, 8}, {90'000, 48'000, 31'000}};
  const Rebalance next = rebalance({16, 8, 8}, {160'000, 32'000, 32'000}, 0.25, before);
  ASSERT_TRUE(next.changed);
  EXPECT_LT(next.sizes[0], 16);
  EXPECT_EQ(next.history.sizes[0], 16);
  EXPECT_EQ(next.history.compute_us[0], 160'000);
  if (next.sizes[1] == 8) {
    EXPECT_EQ(next.history.sizes[1], 12);
    EXPECT_EQ(next.history.compute_us[1], 48'000);
  }
  // Nothing moves: rank 0 (history at its own size) takes the latest window, rank 1 keeps 12.
  const Rebalance same = rebalance({8, 8}, {32'000, 32'000}, 0.25, {{8, 12}, {31'000, 48'000}});
  EXPECT_FALSE(same.changed);
  EXPECT_EQ(same.history.sizes, (std::vector<int64_t>{8, 12}));
  EXPECT_EQ(same.history.compute_us, (std::vector<int64_t>{32'000, 48'000}));
}

TEST(Balance, EqualSpeedsKeepTheSizes) {
  for (const auto& sizes : std::vector<std::vector<int64_t>>{{16, 16, 16, 16}, {22, 21, 21}}) {
    const std::vector<int64_t> times(sizes.size(), 90'000);
    const Rebalance same = rebalance(sizes, times, 0.25);
    EXPECT_FALSE(same.changed);
    EXPECT_EQ(same.sizes, sizes);
  }
  // Already balanced unequal slices (equal step times) stay as they are, with or without the
  // windows that led there (a linear cluster: 1 ms per example, rank 0 without delay).
  const std::vector<int64_t> sizes = {40, 10, 7, 7};
  const std::vector<int64_t> times = {40'000, 40'000, 40'000, 40'000};
  EXPECT_FALSE(rebalance(sizes, times, 0.25).changed);
  const BalanceHistory led_there{{36, 12, 8, 8}, {36'000, 42'000, 41'000, 41'000}};
  EXPECT_FALSE(rebalance(sizes, times, 0.25, led_there).changed);
}

TEST(Balance, NoiseOfThreePercentIsBelowTheMinimumGain) {
  // With 4 ranks, the most a ±3% spread can promise is one rank at +3% and three at −3%:
  // perfectly balanced, T' = 1 / mean(1 / t) = 0.984 T₀ against T = 1.03 T₀, a 4.4% gain,
  // under kMinGain. A large B, so that the sizes could follow the noise if allowed.
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<double> noise(-0.03, 0.03);
  const std::vector<int64_t> sizes = equal_sizes(1024, 4);
  for (int trial = 0; trial < 500; ++trial) {
    std::vector<int64_t> times;
    for (int r = 0; r < 4; ++r) times.push_back(std::llround(100'000 * (1 + noise(rng))));
    const Rebalance same = rebalance(sizes, times, 0.25);
    EXPECT_FALSE(same.changed) << testing::PrintToString(times);
    EXPECT_LT(same.predicted_gain, kMinGain);
    EXPECT_EQ(same.sizes, sizes);
  }
  // The extreme case itself, and a real imbalance just past it, which is acted on.
  EXPECT_FALSE(rebalance(sizes, {103'000, 97'000, 97'000, 97'000}, 0.25).changed);
  EXPECT_TRUE(rebalance(sizes, {115'000, 97'000, 97'000, 97'000}, 0.25).changed);
}

TEST(Balance, NoiseOfThreePercentAfterConvergingMovesNothing) {
  // 1 ms per example, 8 ms of delay on rank 3, B = 64: balanced at 18/18/18/10 (18 ms each),
  // reached from 16/16/16/14 — the history every rank's fit uses. With ±3% on the latest window,
  // the fitted level T' = Σ(t_r/c_r) / Σ(1/c_r) stays within the measured times, and at worst
  // (the +3% rank's slope the largest, the others' the smallest) 4.9% below the largest: no move.
  std::mt19937_64 rng(29);
  std::uniform_real_distribution<double> noise(-0.03, 0.03);
  const std::vector<int64_t> sizes = {18, 18, 18, 10};
  const BalanceHistory history{{16, 16, 16, 14}, {16'000, 16'000, 16'000, 22'000}};
  for (int trial = 0; trial < 500; ++trial) {
    std::vector<int64_t> times;
    for (int r = 0; r < 4; ++r) times.push_back(std::llround(18'000 * (1 + noise(rng))));
    EXPECT_FALSE(rebalance(sizes, times, 0.25, history).changed) << testing::PrintToString(times);
  }
}

TEST(Balance, RandomInputsNeverBreakTheBoundsAndRepeatBitForBit) {
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 2000; ++trial) {
    const int world = 1 + static_cast<int>(rng() % 8);
    std::vector<int64_t> sizes, times;
    BalanceHistory history;
    for (int r = 0; r < world; ++r) {
      sizes.push_back(1 + static_cast<int64_t>(rng() % 40));
      times.push_back(static_cast<int64_t>(rng() % 300'000));  // 0 µs included
      history.sizes.push_back(1 + static_cast<int64_t>(rng() % 40));
      history.compute_us.push_back(static_cast<int64_t>(rng() % 300'000));
    }
    if (trial % 3 == 0) history = {};
    const double max_change = static_cast<double>(rng() % 101) / 100;
    const Rebalance a = rebalance(sizes, times, max_change, history);
    SCOPED_TRACE(testing::Message() << testing::PrintToString(sizes) << " "
                                    << testing::PrintToString(times) << " " << max_change);
    expect_within_bounds(sizes, a.sizes, max_change);
    EXPECT_EQ(a.changed, a.sizes != sizes);
    if (a.changed) {
      EXPECT_GE(a.predicted_gain, kMinGain);
    }
    const Rebalance b = rebalance(sizes, times, max_change, history);
    EXPECT_EQ(b.sizes, a.sizes);
    EXPECT_EQ(b.history.sizes, a.history.sizes);
    EXPECT_EQ(b.history.compute_us, a.history.compute_us);
    EXPECT_EQ(std::memcmp(&a.predicted_gain, &b.predicted_gain, sizeof(double)), 0);
    for (size_t r = 0; r < a.model.size(); ++r) {
      EXPECT_EQ(std::memcmp(&a.model[r], &b.model[r], sizeof(StepTimeModel)), 0);
    }
  }
}

TEST(Balance, RefusesMismatchedOrInvalidInputs) {
  EXPECT_THROW(rebalance({4, 4}, {10}, 0.25), InvalidArgument);
  EXPECT_THROW(rebalance({4, 0}, {10, 10}, 0.25), InvalidArgument);
  EXPECT_THROW(rebalance({4, 4}, {10, -1}, 0.25), InvalidArgument);
  EXPECT_THROW(rebalance({4, 4}, {10, 10}, -0.1), InvalidArgument);
  EXPECT_THROW(rebalance({}, {}, 0.25), InvalidArgument);
  // A history of another world, or with an empty slice.
  EXPECT_THROW(rebalance({4, 4}, {10, 10}, 0.25, {{4, 4, 4}, {10, 10, 10}}), InvalidArgument);
  EXPECT_THROW(rebalance({4, 4}, {10, 10}, 0.25, {{4, 4}, {10}}), InvalidArgument);
  EXPECT_THROW(rebalance({4, 4}, {10, 10}, 0.25, {{0, 4}, {10, 10}}), InvalidArgument);
  EXPECT_THROW(fit_step_time(0, 10, 1, 10), InvalidArgument);
}

}  // namespace
}  // namespace krab::elastic
