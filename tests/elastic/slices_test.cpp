// The slices of the fixed global batch, their weights and the largest-remainder rounding
// (src/elastic/slices.h), each against an expectation computed another way: the properties that
// define the equal split, and a brute-force search for the nearest integer vector. The balancer's
// tests are in balance_test.cpp.
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

}  // namespace
}  // namespace krab::elastic
