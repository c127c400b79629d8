// train/noise_scale.h against gradients drawn with a known noise: a true gradient G and
// per-example noise of variance s² per coordinate (tr Σ = d s²), averaged over slices of b
// examples on W ranks, as data parallelism sees them. B_simple must come out near d s² / |G|².
#include "train/noise_scale.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "core/errors.h"

namespace krab::train {
namespace {

// `steps` steps of W ranks × b examples; returns the estimator after them.
NoiseScale simulate(int64_t d, double g_norm, double s, int W, int64_t b, int steps,
                    double smoothing) {
  auto gen = at::detail::createCPUGenerator(11);
  const at::Tensor G =
      torch::full({d}, g_norm / std::sqrt(static_cast<double>(d)), torch::kFloat64);
  NoiseScale ns(smoothing);
  for (int t = 0; t < steps; ++t) {
    at::Tensor sum = torch::zeros({d}, torch::kFloat64);
    double small_sq = 0;
    for (int r = 0; r < W; ++r) {
      // The mean of b examples' noise: variance s² / b per coordinate.
      const at::Tensor g =
          G + at::randn({d}, gen, torch::kFloat64) * (s / std::sqrt(static_cast<double>(b)));
      small_sq += g.pow(2).sum().item<double>() / W;
      sum += g;
    }
    const double big_sq = (sum / W).pow(2).sum().item<double>();
    ns.add(small_sq, b, big_sq, W * b);
  }
  return ns;
}

TEST(NoiseScale, RecoversTheNoiseScaleOfKnownGradients) {
  // d = 1000, |G| = 1, s = 0.5: tr Σ = 250, B_simple = 250.
  const NoiseScale ns = simulate(1000, 1.0, 0.5, 4, 32, 400, 0.99);
  ASSERT_TRUE(ns.b_simple().has_value());
  EXPECT_NEAR(*ns.b_simple(), 250.0, 250.0 * 0.08);
  EXPECT_NEAR(ns.gradient_sq(), 1.0, 0.08);
  EXPECT_NEAR(ns.trace_sigma(), 250.0, 250.0 * 0.08);
  EXPECT_EQ(ns.steps(), 400);
}

TEST(NoiseScale, ItGrowsAsTheGradientShrinks) {
  // The same noise against a gradient a third as long: B_simple nine times larger (1/0.3²),
  // as late in training when the batch should grow. A small |G|² is hard to tell from the
  // noise (the paper's caveat): larger slices and a longer average keep the estimate steady.
  const double early = *simulate(1000, 1.0, 0.5, 4, 256, 2000, 0.995).b_simple();
  const double late = *simulate(1000, 0.3, 0.5, 4, 256, 2000, 0.995).b_simple();
  EXPECT_NEAR(late / early, 1 / 0.09, 0.25 / 0.09);
}

TEST(NoiseScale, NoEstimateBeforeBothAveragesArePositive) {
  NoiseScale ns;
  EXPECT_FALSE(ns.b_simple());
  // Identical slices (no noise seen): tr Σ = 0, no estimate.
  ns.add(4.0, 8, 4.0, 32);
  EXPECT_FALSE(ns.b_simple());
  EXPECT_DOUBLE_EQ(ns.gradient_sq(), 4.0);
  EXPECT_THROW(ns.add(1.0, 8, 1.0, 8), InvalidArgument);
}

}  // namespace
}  // namespace krab::train
