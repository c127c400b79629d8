// Federated partitioners: coverage, the skew each kind promises, determinism, bad input.
#include "data/partition.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <set>

#include "core/errors.h"
#include "test_util.h"

namespace krab::data {
namespace {

using testing::expect_throw_containing;

// n examples with labels 0..classes-1 interleaved (i mod classes), so label order != index order.
at::Tensor interleaved_labels(int64_t n, int64_t classes) {
  return torch::arange(n, torch::kLong).remainder(classes);
}

// Every index in [0, n) exactly once over all clients, no client empty, each list ascending.
void expect_disjoint_cover(const std::vector<std::vector<int64_t>>& parts, int64_t n) {
  std::vector<int> seen(n, 0);
  for (const auto& p : parts) {
    EXPECT_FALSE(p.empty());
    EXPECT_TRUE(std::is_sorted(p.begin(), p.end()));
    for (int64_t i : p) {
      ASSERT_GE(i, 0);
      ASSERT_LT(i, n);
      ++seen[i];
    }
  }
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(seen[i], 1) << "example " << i;
}

double mean_distinct_classes(const std::vector<std::vector<int64_t>>& parts,
                             const at::Tensor& labels) {
  double total = 0;
  for (const auto& p : parts) {
    std::set<int64_t> c;
    for (int64_t i : p) c.insert(labels[i].item<int64_t>());
    total += static_cast<double>(c.size());
  }
  return total / static_cast<double>(parts.size());
}

TEST(Partition, IidCoversEveryExampleWithBalancedSizes) {
  const at::Tensor labels = interleaved_labels(1003, 10);
  PartitionSpec spec;
  spec.kind = "iid";
  spec.clients = 10;
  const auto parts = partition(labels, 10, spec);
  ASSERT_EQ(parts.size(), 10u);
  expect_disjoint_cover(parts, 1003);
  for (const auto& p : parts) {
    EXPECT_GE(p.size(), 100u);
    EXPECT_LE(p.size(), 101u);
  }
  // A random 100-example draw from 10 balanced classes sees (almost) all of them.
  EXPECT_GT(mean_distinct_classes(parts, labels), 9.5);
}

TEST(Partition, ClassesGivesEachClientAtMostItsShardsWorthOfClasses) {
  // 10 classes x 100 examples; 50 clients x 2 shards of 10: a shard never straddles classes.
  const at::Tensor labels = interleaved_labels(1000, 10);
  PartitionSpec spec;
  spec.kind = "classes";
  spec.clients = 50;
  spec.classes_per_client = 2;
  spec.seed = 3;
  const auto parts = partition(labels, 10, spec);
  expect_disjoint_cover(parts, 1000);
  int two = 0;
  for (const auto& p : parts) {
    EXPECT_EQ(p.size(), 20u);
    std::set<int64_t> c;
    for (int64_t i : p) c.insert(labels[i].item<int64_t>());
    EXPECT_LE(c.size(), 2u);
    two += c.size() == 2;
  }
  // Two random shards of 100 come from one class with probability ~ 9/99: most clients see two.
  EXPECT_GE(two, 35);
}

TEST(Partition, DirichletSkewFollowsAlpha) {
  const at::Tensor labels = interleaved_labels(5000, 10);
  PartitionSpec spec;
  spec.kind = "dirichlet";
  spec.clients = 20;
  spec.seed = 11;
  spec.alpha = 0.1;
  const auto skewed = partition(labels, 10, spec);
  expect_disjoint_cover(skewed, 5000);
  spec.alpha = 1000;
  const auto flat = partition(labels, 10, spec);
  expect_disjoint_cover(flat, 5000);
  // alpha 0.1: a client holds only a few classes in any quantity; alpha 1000: near iid, every
  // client ~ 1/20 of each class (500 of class c -> ~25 each).
  EXPECT_LT(mean_distinct_classes(skewed, labels), 6.0);
  EXPECT_EQ(mean_distinct_classes(flat, labels), 10.0);
  for (const auto& p : flat) {
    EXPECT_GT(p.size(), 200u);
    EXPECT_LT(p.size(), 300u);
  }
}

TEST(Partition, DeterministicInTheSeed) {
  const at::Tensor labels = interleaved_labels(600, 6);
  for (const char* kind : {"iid", "classes", "dirichlet"}) {
    PartitionSpec spec;
    spec.kind = kind;
    spec.clients = 12;
    spec.seed = 5;
    const auto a = partition(labels, 6, spec);
    const auto b = partition(labels, 6, spec);
    EXPECT_EQ(a, b) << kind;
    spec.seed = 6;
    EXPECT_NE(a, partition(labels, 6, spec)) << kind;
  }
}

TEST(Partition, GammaSamplesHaveTheRightMoments) {
  for (double shape : {0.3, 1.0, 2.5}) {
    std::mt19937_64 rng(42);
    const int n = 40000;
    double s = 0, s2 = 0;
    for (int i = 0; i < n; ++i) {
      const double x = sample_gamma(shape, rng);
      ASSERT_GT(x, 0);
      s += x;
      s2 += x * x;
    }
    const double mean = s / n, var = s2 / n - mean * mean;
    // Gamma(k, 1): mean k, variance k.
    EXPECT_NEAR(mean, shape, 0.03 * shape + 0.01) << shape;
    EXPECT_NEAR(var, shape, 0.08 * shape + 0.01) << shape;
  }
}

TEST(Partition, BadInputNamesTheKey) {
  const at::Tensor labels = interleaved_labels(100, 10);
  PartitionSpec spec;
  spec.kind = "shards";
  expect_throw_containing<InvalidArgument>([&] { partition(labels, 10, spec); },
                                           {"federated.partition", "shards", "dirichlet"});
  spec.kind = "iid";
  spec.clients = 101;
  expect_throw_containing<InvalidArgument>([&] { partition(labels, 10, spec); },
                                           {"federated.clients", "101", "100"});
  spec.clients = 60;
  spec.kind = "classes";
  expect_throw_containing<InvalidArgument>([&] { partition(labels, 10, spec); },
                                           {"federated.classes_per_client", "120"});
  spec.kind = "dirichlet";
  spec.alpha = 0;
  expect_throw_containing<InvalidArgument>([&] { partition(labels, 10, spec); },
                                           {"federated.alpha"});
  spec.alpha = 0.5;
  expect_throw_containing<InvalidArgument>([&] { partition(labels, 5, spec); },
                                           {"label", "outside"});
}

}  // namespace
}  // namespace krab::data
