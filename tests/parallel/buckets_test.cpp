// Bucket planning: a pure function, checked against hand-worked plans.
#include "parallel/buckets.h"

#include <gtest/gtest.h>

namespace krab::parallel {
namespace {

TEST(PlanBuckets, ReverseRegistrationOrderUnderTheCap) {
  // Four float params of 10, 20, 30, 40 elements = 40, 80, 120, 160 bytes; cap 200 bytes.
  // Reverse order: 3 (160) | 2 (120) + 1 (80) = 200 | 0 (40).
  auto p = plan_buckets({10, 20, 30, 40}, 4, 200);
  ASSERT_EQ(p.buckets.size(), 3u);
  EXPECT_EQ(p.buckets[0], (std::vector<int64_t>{3}));
  EXPECT_EQ(p.buckets[1], (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(p.buckets[2], (std::vector<int64_t>{0}));
  EXPECT_EQ(p.bucket_numel, (std::vector<int64_t>{40, 50, 10}));
  EXPECT_EQ(p.bucket_of, (std::vector<int64_t>{2, 1, 1, 0}));
  EXPECT_EQ(p.offset_of, (std::vector<int64_t>{0, 30, 0, 0}));
}

TEST(PlanBuckets, OversizedParameterGetsABucketOfItsOwn) {
  auto p = plan_buckets({5, 1000, 5}, 4, 100);
  ASSERT_EQ(p.buckets.size(), 3u);
  EXPECT_EQ(p.buckets[1], (std::vector<int64_t>{1}));
  EXPECT_EQ(p.bucket_numel[1], 1000);
}

TEST(PlanBuckets, ZeroCapMeansOneBucketPerParameter) {
  auto p = plan_buckets({3, 4, 5}, 4, 0);
  ASSERT_EQ(p.buckets.size(), 3u);
  for (size_t b = 0; b < 3; ++b) EXPECT_EQ(p.buckets[b].size(), 1u);
}

TEST(PlanBuckets, HugeCapMeansOneBucket) {
  auto p = plan_buckets({3, 4, 5}, 4, int64_t{1} << 40);
  ASSERT_EQ(p.buckets.size(), 1u);
  EXPECT_EQ(p.buckets[0], (std::vector<int64_t>{2, 1, 0}));
  EXPECT_EQ(p.bucket_numel[0], 12);
}

TEST(PlanBuckets, EveryParameterPlacedOnceAndOffsetsTile) {
  std::vector<int64_t> numel;
  for (int i = 0; i < 50; ++i) numel.push_back(1 + (i * 37) % 91);
  auto p = plan_buckets(numel, 4, 256);
  std::vector<int> seen(numel.size(), 0);
  for (size_t b = 0; b < p.buckets.size(); ++b) {
    int64_t off = 0;
    for (int64_t i : p.buckets[b]) {
      ++seen[i];
      EXPECT_EQ(p.bucket_of[i], static_cast<int64_t>(b));
      EXPECT_EQ(p.offset_of[i], off);
      off += numel[i];
    }
    EXPECT_EQ(off, p.bucket_numel[b]);
    // Under the cap unless the bucket holds one parameter.
    if (p.buckets[b].size() > 1) {
      EXPECT_LE(p.bucket_numel[b] * 4, 256);
    }
  }
  for (int s : seen) EXPECT_EQ(s, 1);
}

TEST(PlanBuckets, NoParameters) {
  auto p = plan_buckets({}, 4, 100);
  EXPECT_TRUE(p.buckets.empty());
}

}  // namespace
}  // namespace krab::parallel
