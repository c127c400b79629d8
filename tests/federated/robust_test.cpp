// Robust aggregation on small hand-worked examples (odd and even counts), Krum against a
// byzantine minority, and update validation's reasons.
#include "federated/robust.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/errors.h"

namespace krab::federated {
namespace {

at::Tensor vec(std::vector<float> v) { return torch::tensor(v); }

void expect_values(const at::Tensor& t, const std::vector<double>& want, double tol = 1e-6) {
  at::Tensor c = t.to(at::kDouble).contiguous();
  ASSERT_EQ(c.numel(), static_cast<int64_t>(want.size()));
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_NEAR(c.data_ptr<double>()[i], want[i], tol) << "element " << i;
  }
}

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "(no InvalidArgument thrown)";
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

TEST(Mean, WeightedAndUnweighted) {
  const std::vector<at::Tensor> u = {vec({1, 2}), vec({3, 4})};
  expect_values(mean(u), {2, 3});
  expect_values(mean(u, {1, 3}), {2.5, 3.5});  // (1*[1,2] + 3*[3,4]) / 4
  EXPECT_THROW(mean(u, {0, 0}), InvalidArgument);
  EXPECT_THROW(mean(u, {1}), InvalidArgument);
  EXPECT_THROW(mean(u, {1, -1}), InvalidArgument);
  EXPECT_THROW(mean({}), InvalidArgument);
  EXPECT_TRUE(contains(error_of([] { mean({vec({1, 2}), vec({1})}); }), "update 1 has 1"));
}

TEST(Median, OddAndEvenCounts) {
  // Columns: {1, 3, 2} -> 2 and {5, -1, 10} -> 5.
  expect_values(median({vec({1, 5}), vec({3, -1}), vec({2, 10})}), {2, 5});
  // Even: {1, 3, 2, 100} -> (2 + 3) / 2 and {5, -1, 10, 0} -> (0 + 5) / 2, the average of the
  // two middle values (not torch's lower median).
  expect_values(median({vec({1, 5}), vec({3, -1}), vec({2, 10}), vec({100, 0})}), {2.5, 2.5});
  expect_values(median({vec({7, -7})}), {7, -7});
}

TEST(TrimmedMean, DropsBetaAtEachEnd) {
  // n = 5, beta = 0.2: drop one at each end per column. {1, 2, 3, 4, 100} -> mean(2, 3, 4) = 3;
  // {-50, 0, 1, 2, 3} -> mean(0, 1, 2) = 1.
  const std::vector<at::Tensor> u = {vec({1, 3}), vec({2, -50}), vec({3, 0}), vec({4, 1}),
                                     vec({100, 2})};
  expect_values(trimmed_mean(u, 0.2), {3, 1});
  // floor(0.1 * 5) = 0: the plain mean.
  expect_values(trimmed_mean(u, 0.1), {22, -8.8});
  // Even n = 4, beta = 0.25: {1, 2, 3, 100} -> mean(2, 3) = 2.5.
  expect_values(trimmed_mean({vec({1}), vec({100}), vec({3}), vec({2})}, 0.25), {2.5});
  EXPECT_TRUE(contains(error_of([&] { trimmed_mean(u, 0.5); }), "beta"));
  EXPECT_THROW(trimmed_mean(u, -0.1), InvalidArgument);
}

TEST(Krum, ScoresByHand) {
  // 1-D points 0, 1, 2, 3, 10 with f = 1: each score sums the n - f - 2 = 2 smallest squared
  // distances. 0: 1 + 4; 1: 1 + 1; 2: 1 + 1; 3: 1 + 4; 10: 49 + 64.
  const std::vector<at::Tensor> u = {vec({0}), vec({1}), vec({2}), vec({3}), vec({10})};
  const auto s = krum_scores(u, 1);
  const std::vector<double> want = {5, 2, 2, 5, 113};
  ASSERT_EQ(s.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_DOUBLE_EQ(s[i], want[i]) << i;
  expect_values(krum(u, 1), {1});  // tie with point 2: the lower index wins
  EXPECT_EQ(krum_select(u, 1, 3), (std::vector<int64_t>{1, 2, 0}));
  expect_values(multi_krum(u, 1, 3), {1});  // mean of 1, 2, 0
}

TEST(Krum, PicksTheHonestClusterDespiteByzantineClients) {
  torch::manual_seed(3);
  const int64_t honest = 7, f = 2, d = 50;
  const at::Tensor centre = torch::randn({d});
  std::vector<at::Tensor> u;
  for (int64_t i = 0; i < honest; ++i) u.push_back(centre + 0.1 * torch::randn({d}));
  // The attackers agree with each other (a tight pair), far from everyone else.
  const at::Tensor evil = centre + 100;
  u.push_back(evil.clone());
  u.push_back(evil + 0.01);
  for (int64_t i : krum_select(u, f, honest - f)) EXPECT_LT(i, honest);
  EXPECT_LT((krum(u, f) - centre).norm().item<double>(), 1.0);
  EXPECT_LT((multi_krum(u, f, 5) - centre).norm().item<double>(), 0.5);
  // The mean, by contrast, is dragged far away.
  EXPECT_GT((mean(u) - centre).norm().item<double>(), 100.0);
}

TEST(Krum, NeedsEnoughUpdates) {
  const std::vector<at::Tensor> four = {vec({0}), vec({1}), vec({2}), vec({3})};
  const std::string e = error_of([&] { krum(four, 1); });
  EXPECT_TRUE(contains(e, "n = 4") && contains(e, "f = 1")) << e;
  EXPECT_THROW(krum(four, -1), InvalidArgument);
  const std::vector<at::Tensor> five = {vec({0}), vec({1}), vec({2}), vec({3}), vec({4})};
  EXPECT_THROW(multi_krum(five, 1, 5), InvalidArgument);  // m > n - f
  EXPECT_THROW(multi_krum(five, 1, 0), InvalidArgument);
}

TEST(Aggregator, FactoryByName) {
  const std::vector<at::Tensor> u = {vec({0}), vec({1}), vec({2}), vec({3}), vec({10})};
  AggregatorOptions o;
  o.trim_beta = 0.2;
  o.byzantine_f = 1;
  o.krum_m = 3;
  EXPECT_NEAR(make_aggregator("mean", o)->aggregate(u).item<float>(), 3.2, 1e-6);
  EXPECT_NEAR(make_aggregator("mean", o)->aggregate(u, {0, 0, 0, 0, 1}).item<float>(), 10, 1e-6);
  EXPECT_NEAR(make_aggregator("median", o)->aggregate(u).item<float>(), 2, 1e-6);
  EXPECT_NEAR(make_aggregator("trimmed_mean", o)->aggregate(u).item<float>(), 2, 1e-6);
  EXPECT_NEAR(make_aggregator("krum", o)->aggregate(u).item<float>(), 1, 1e-6);
  EXPECT_NEAR(make_aggregator("multi_krum", o)->aggregate(u).item<float>(), 1, 1e-6);
  EXPECT_EQ(make_aggregator("multi_krum", o)->name(), "multi_krum");
  const std::string e = error_of([] { make_aggregator("bulyan"); });
  EXPECT_TRUE(contains(e, "'bulyan'") && contains(e,
                                                  "mean, median, trimmed_mean, krum, "
                                                  "multi_krum"))
      << e;
  o.trim_beta = 0.6;
  EXPECT_THROW(make_aggregator("trimmed_mean", o), InvalidArgument);
  EXPECT_THROW(make_aggregator("median")->aggregate(u, {1, 2}), InvalidArgument);
}

TEST(ValidateUpdate, AcceptsAGoodUpdate) {
  EXPECT_EQ(validate_update("c1", vec({3, 4}), 2, 5.0), "");
  EXPECT_EQ(validate_update("c1", vec({3e30f, 4e30f}), 2, std::numeric_limits<double>::infinity()),
            "");
}

TEST(ValidateUpdate, RejectionsNameTheClientAndTheNumbers) {
  auto nan = std::numeric_limits<float>::quiet_NaN();
  auto inf = std::numeric_limits<float>::infinity();
  std::string r = validate_update("c7", vec({1, nan, 2, nan}), 4, 10);
  EXPECT_TRUE(contains(r, "client 'c7'") && contains(r, "2 NaN") && contains(r, "index 1")) << r;
  r = validate_update("c8", vec({1, 2, -inf}), 3, 10);
  EXPECT_TRUE(contains(r, "client 'c8'") && contains(r, "1 Inf") && contains(r, "index 2")) << r;
  r = validate_update("c9", vec({1, 2, 3}), 1024, 10);
  EXPECT_TRUE(contains(r, "client 'c9'") && contains(r, "3 elements, expected 1024")) << r;
  r = validate_update("big", vec({3, 4}), 2, 4.5);
  EXPECT_TRUE(contains(r, "client 'big'") && contains(r, "norm 5 ") && contains(r, "limit 4.5"))
      << r;
  // Norms that overflow float32 are still measured.
  r = validate_update("huge", vec({3e30f, 4e30f}), 2, 1e6);
  EXPECT_TRUE(contains(r, "norm 5e+30")) << r;
  r = validate_update("dt", vec({1, 2}).to(at::kDouble), 2, 10);
  EXPECT_TRUE(contains(r, "client 'dt'") && contains(r, "Double")) << r;
  r = validate_update("2d", torch::zeros({2, 2}), 4, 10);
  EXPECT_TRUE(contains(r, "client '2d'") && contains(r, "[2, 2]")) << r;
  EXPECT_TRUE(contains(validate_update("none", at::Tensor(), 4, 10), "client 'none'"));
  EXPECT_THROW(validate_update("c", vec({1}), 1, 0), InvalidArgument);
}

}  // namespace
}  // namespace krab::federated
