// The slices of the fixed global batch, their weights, the largest-remainder rounding and the
// balancer (src/elastic/slices.h), each against an expectation computed another way: the
// properties that define the equal split, a brute-force search for the nearest integer vector,
// and a simulated cluster whose step time is n_r · c + delay_r.
#include "elastic/slices.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>

#include "core/errors.h"

namespace krab::elastic {
namespace {

bool bitwise_one(double w) {
  const double one = 1.0;
  return std::memcmp(&w, &one, sizeof w) == 0;
}

// The slices tile [0, B) in rank order, each at least one example, with weights W · n_r / B.
void expect_tiles(const std::vector<RankSlice>& slices, int64_t total) {
  ASSERT_FALSE(slices.empty());
  const auto world = static_cast<double>(slices.size());
  EXPECT_EQ(slices.front().begin, 0);
  EXPECT_EQ(slices.back().end, total);
  double weights = 0;
  for (size_t r = 0; r < slices.size(); ++r) {
    EXPECT_GE(slices[r].size(), 1) << "rank " << r;
    if (r > 0) {
      EXPECT_EQ(slices[r].begin, slices[r - 1].end) << "rank " << r;
    }
    // The weight's meaning: its share of the global batch, times W.
    EXPECT_NEAR(slices[r].weight * static_cast<double>(total) / world,
                static_cast<double>(slices[r].size()), 1e-9);
    weights += slices[r].weight;
  }
  EXPECT_NEAR(weights, world, 1e-12);
}

TEST(Slices, EqualSplitTilesAndIsTheOnlyBalancedNonincreasingSplit) {
  // Sizes in {⌊B/W⌋, ⌊B/W⌋ + 1}, nonincreasing in rank and summing to B: exactly one vector
  // has all three properties, so checking them checks the split itself.
  for (int64_t total = 1; total <= 64; ++total) {
    for (int world = 1; world <= total; ++world) {
      SCOPED_TRACE(testing::Message() << "B " << total << " W " << world);
      const auto slices = plan_slices(total, world);
      ASSERT_EQ(slices.size(), static_cast<size_t>(world));
      expect_tiles(slices, total);
      for (size_t r = 0; r < slices.size(); ++r) {
        EXPECT_TRUE(slices[r].size() == total / world || slices[r].size() == total / world + 1);
        if (r > 0) {
          EXPECT_LE(slices[r].size(), slices[r - 1].size());
        }
        if (total % world == 0) {
          EXPECT_TRUE(bitwise_one(slices[r].weight)) << slices[r].weight;
        }
      }
    }
  }
}

TEST(Slices, UnequalSizesTileInRankOrder) {
  const std::vector<int64_t> sizes = {5, 1, 9, 3, 14};
  const auto slices = plan_slices(sizes);
  expect_tiles(slices, 32);
  for (size_t r = 0; r < sizes.size(); ++r) EXPECT_EQ(slices[r].size(), sizes[r]);
  EXPECT_DOUBLE_EQ(slices[4].weight, 5.0 * 14 / 32);
  // W · n_r == B is exactly 1 even when the other slices differ.
  EXPECT_TRUE(bitwise_one(plan_slices({4, 2, 6})[0].weight));
}

TEST(Slices, RefusesWorldsThatCannotGiveEveryRankAnExample) {
  EXPECT_THROW(equal_sizes(3, 4), InvalidArgument);
  EXPECT_THROW(equal_sizes(8, 0), InvalidArgument);
  EXPECT_THROW(plan_slices(std::vector<int64_t>{}), InvalidArgument);
  EXPECT_THROW(plan_slices({3, 0, 2}), InvalidArgument);
  EXPECT_THROW(plan_slices({int64_t{1} << 52, int64_t{1} << 52, 1}), InvalidArgument);
}

// The integer vector a with Σ a = total nearest q in Σ (a_r − q_r)², ties broken toward the
// lexicographically largest a (the lower index gets the unit), by enumerating every vector.
// Quotas are m_r / 16 so that the arithmetic is exact: 16 a_r − m_r.
std::vector<int64_t> nearest_by_enumeration(const std::vector<int64_t>& sixteenths, int64_t total) {
  std::vector<int64_t> best, a(sixteenths.size(), 0);
  int64_t best_cost = -1;
  std::function<void(size_t, int64_t)> walk = [&](size_t r, int64_t left) {
    if (r + 1 == a.size()) {
      a[r] = left;
      int64_t cost = 0;
      for (size_t k = 0; k < a.size(); ++k)
        cost += (16 * a[k] - sixteenths[k]) * (16 * a[k] - sixteenths[k]);
      if (best_cost < 0 || cost < best_cost || (cost == best_cost && a > best)) {
        best_cost = cost;
        best = a;
      }
      return;
    }
    for (int64_t v = 0; v <= left; ++v) {
      a[r] = v;
      walk(r + 1, left - v);
    }
  };
  walk(0, total);
  return best;
}

void expect_matches_enumeration(const std::vector<int64_t>& sixteenths, int64_t total) {
  std::vector<double> quotas;
  for (int64_t m : sixteenths) quotas.push_back(static_cast<double>(m) / 16);
  EXPECT_EQ(largest_remainder(quotas, total), nearest_by_enumeration(sixteenths, total))
      << "total " << total << ", quotas (x16) " << testing::PrintToString(sixteenths);
}

TEST(Slices, LargestRemainderIsTheNearestIntegerSplitByEnumeration) {
  // Every split of 16 · total sixteenths among W <= 3 quotas, total <= 3: ties included.
  for (int64_t total = 0; total <= 3; ++total) {
    expect_matches_enumeration({16 * total}, total);
    for (int64_t m0 = 0; m0 <= 16 * total; ++m0) {
      expect_matches_enumeration({m0, 16 * total - m0}, total);
      for (int64_t m1 = 0; m0 + m1 <= 16 * total; ++m1)
        expect_matches_enumeration({m0, m1, 16 * total - m0 - m1}, total);
    }
  }
  // Seeded random splits among 4..6 quotas.
  std::mt19937_64 rng(27);
  for (int trial = 0; trial < 300; ++trial) {
    const int world = 4 + static_cast<int>(rng() % 3);
    const auto total = static_cast<int64_t>(rng() % 8);
    std::vector<int64_t> m(static_cast<size_t>(world), 0);
    for (int64_t unit = 0; unit < 16 * total; ++unit) ++m[rng() % m.size()];
    expect_matches_enumeration(m, total);
  }
}

TEST(Slices, LargestRemainderRefusesQuotasThatDoNotSumToTheTotal) {
  EXPECT_THROW(largest_remainder({1.5, 1.5}, 4), InvalidArgument);
  EXPECT_THROW(largest_remainder({-0.5, 2.5}, 2), InvalidArgument);
  EXPECT_THROW(largest_remainder({NAN, 2}, 2), InvalidArgument);
}

// ---- the balancer, on a simulated cluster: step time of rank r = n_r · c + delay_r (µs) ----

std::vector<int64_t> step_times(const std::vector<int64_t>& sizes, int64_t per_example,
                                const std::vector<int64_t>& delay) {
  std::vector<int64_t> t;
  for (size_t r = 0; r < sizes.size(); ++r) t.push_back(sizes[r] * per_example + delay[r]);
  return t;
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

// Rebalances until the balancer keeps the sizes (at most `limit` changes), checking the bounds
// of every move and that every change lowers the simulated step time; returns the changes made.
int settle(std::vector<int64_t>& sizes, int64_t per_example, const std::vector<int64_t>& delay,
           int limit) {
  int changes = 0;
  for (; changes <= limit; ++changes) {
    const auto before = step_times(sizes, per_example, delay);
    const Rebalance next = rebalance(sizes, before, 0.25);
    expect_within_bounds(sizes, next.sizes, 0.25);
    if (!next.changed) break;
    const auto after = step_times(next.sizes, per_example, delay);
    EXPECT_LT(*std::max_element(after.begin(), after.end()),
              *std::max_element(before.begin(), before.end()))
        << testing::PrintToString(next.sizes);
    sizes = next.sizes;
  }
  return changes;
}

int64_t spread(const std::vector<int64_t>& t) {
  return *std::max_element(t.begin(), t.end()) - *std::min_element(t.begin(), t.end());
}

TEST(Balance, AFixedDelayOnOneRankConvergesToEqualStepTimesInThreeRebalances) {
  // B = 64 on 4 ranks, c = 1 ms per example, a delay of D examples' time on one rank. Equal step
  // times need n_slow + D = n_fast and 3 n_fast + n_slow = 64: n_slow = (64 − 3D) / 4. Up to
  // D = 10 (the slow slice moves by 7.5 examples, two moves of the bound m = 4 and a bit) three
  // rebalances reach it.
  const int64_t c = 1000;
  for (int slow = 0; slow < 4; ++slow) {
    for (int64_t d : {2, 4, 6, 8, 10}) {
      SCOPED_TRACE(testing::Message() << "slow rank " << slow << ", delay " << d);
      std::vector<int64_t> delay(4, 0);
      delay[slow] = d * c;
      std::vector<int64_t> sizes = equal_sizes(64, 4);
      EXPECT_LE(settle(sizes, c, delay, 3), 3) << testing::PrintToString(sizes);
      EXPECT_LE(spread(step_times(sizes, c, delay)), c) << testing::PrintToString(sizes);
      EXPECT_NEAR(static_cast<double>(sizes[slow]), (64.0 - 3.0 * d) / 4, 1.0);
    }
  }
}

TEST(Balance, LargerDelaysTakeMoreRebalancesAndAnInfeasibleOneEndsAtOneExample) {
  // n/t underestimates a fixed delay's share, so each move undershoots and a slice that must
  // move by more than about 2.5 bounds takes more than three rebalances: D = 12 needs 9
  // examples moved and takes 4; D = 16 takes 5 and stops at a step time one example above the
  // best split's, (64 + D) / 4 examples (the last example would gain 4.8%, below kMinGain).
  const int64_t c = 1000;
  for (const auto& [d, changes] : std::vector<std::pair<int64_t, int>>{{12, 4}, {16, 5}}) {
    std::vector<int64_t> delay = {0, 0, 0, d * c};
    std::vector<int64_t> sizes = equal_sizes(64, 4);
    EXPECT_EQ(settle(sizes, c, delay, 8), changes) << testing::PrintToString(sizes);
    const auto t = step_times(sizes, c, delay);
    EXPECT_LE(*std::max_element(t.begin(), t.end()), (64 + d) / 4 * c + c)
        << testing::PrintToString(sizes);
  }
  // The straggler: T = 100 ms for 16 examples, +150 ms on rank 3. No split equalises
  // (the delay alone exceeds a fast rank's step), so rank 3 ends at 1 example: step time 250 ms
  // -> 156.25 ms, 1.6x.
  std::vector<int64_t> delay = {0, 0, 0, 150'000};
  std::vector<int64_t> sizes = equal_sizes(64, 4);
  EXPECT_EQ(settle(sizes, 6250, delay, 10), 7);
  EXPECT_EQ(sizes, (std::vector<int64_t>{21, 21, 21, 1}));
}

TEST(Balance, EqualSpeedsKeepTheSizes) {
  for (const auto& sizes : std::vector<std::vector<int64_t>>{{16, 16, 16, 16}, {22, 21, 21}}) {
    const std::vector<int64_t> times(sizes.size(), 90'000);
    const Rebalance same = rebalance(sizes, times, 0.25);
    EXPECT_FALSE(same.changed);
    EXPECT_EQ(same.sizes, sizes);
  }
  // Already balanced unequal slices (equal step times) stay as they are.
  const std::vector<int64_t> sizes = {40, 10, 7, 7};
  EXPECT_FALSE(rebalance(sizes, {50'000, 50'000, 50'000, 50'000}, 0.25).changed);
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

TEST(Balance, RandomInputsNeverBreakTheBoundsAndRepeatBitForBit) {
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 2000; ++trial) {
    const int world = 1 + static_cast<int>(rng() % 8);
    std::vector<int64_t> sizes, times;
    for (int r = 0; r < world; ++r) {
      sizes.push_back(1 + static_cast<int64_t>(rng() % 40));
      times.push_back(static_cast<int64_t>(rng() % 300'000));  // 0 µs included
    }
    const double max_change = static_cast<double>(rng() % 101) / 100;
    const Rebalance a = rebalance(sizes, times, max_change);
    SCOPED_TRACE(testing::Message() << testing::PrintToString(sizes) << " "
                                    << testing::PrintToString(times) << " " << max_change);
    expect_within_bounds(sizes, a.sizes, max_change);
    EXPECT_EQ(a.changed, a.sizes != sizes);
    if (a.changed) {
      EXPECT_GE(a.predicted_gain, kMinGain);
    }
    const Rebalance b = rebalance(sizes, times, max_change);
    EXPECT_EQ(b.sizes, a.sizes);
    EXPECT_EQ(std::memcmp(&a.predicted_gain, &b.predicted_gain, sizeof(double)), 0);
  }
}

TEST(Balance, RefusesMismatchedOrInvalidInputs) {
  EXPECT_THROW(rebalance({4, 4}, {10}, 0.25), InvalidArgument);
  EXPECT_THROW(rebalance({4, 0}, {10, 10}, 0.25), InvalidArgument);
  EXPECT_THROW(rebalance({4, 4}, {10, -1}, 0.25), InvalidArgument);
  EXPECT_THROW(rebalance({4, 4}, {10, 10}, -0.1), InvalidArgument);
  EXPECT_THROW(rebalance({}, {}, 0.25), InvalidArgument);
}

}  // namespace
}  // namespace krab::elastic
