#include <torch/torch.h>

#include <cmath>

#include "core/errors.h"
#include "data/dataset.h"
#include "data/rng.h"

namespace krab::data {
namespace {

// Centroid coordinates are N(0, kCentroidStd^2) and the noise N(0, 1), so two centroids sit
// about kCentroidStd * sqrt(2 * features) apart against unit noise per axis: comfortably
// separable for features >= ~8, yet with enough overlap at small feature counts that accuracy
// is not trivially 100%.
constexpr double kCentroidStd = 1.0;

// Splits the first n - n_test rows off as train, the rest as test.
void split_tail(DataSplits& splits, const at::Tensor& inputs, const at::Tensor& targets,
                int64_t n_test) {
  const int64_t n_train = inputs.size(0) - n_test;
  splits.train = {inputs.narrow(0, 0, n_train).clone(), targets.narrow(0, 0, n_train).clone()};
  if (n_test > 0) {
    splits.test = TensorDataset{inputs.narrow(0, n_train, n_test).clone(),
                                targets.narrow(0, n_train, n_test).clone()};
  }
}

}  // namespace

DataSplits make_synthetic(int64_t samples, int64_t features, int64_t classes, double test_fraction,
                          uint64_t seed) {
  KRAB_CHECK_ARG(samples >= 2, "synthetic samples must be >= 2, got ", samples);
  KRAB_CHECK_ARG(features >= 1, "synthetic features must be >= 1, got ", features);
  KRAB_CHECK_ARG(classes >= 2, "synthetic classes must be >= 2, got ", classes);
  KRAB_CHECK_ARG(test_fraction >= 0.0 && test_fraction < 1.0,
                 "test fraction must be in [0, 1), got ", test_fraction);
  const int64_t n_test = std::llround(static_cast<double>(samples) * test_fraction);
  KRAB_CHECK_ARG(n_test < samples, "test fraction ", test_fraction, " of ", samples,
                 " samples leaves no training examples");

  // Separate streams for centroids and examples: the same seed gives the same centroids
  // whatever the sample count, so a larger set extends the same problem.
  std::mt19937_64 centroid_rng(derive_seed(seed, 0));
  std::mt19937_64 example_rng(derive_seed(seed, 1));

  std::vector<float> centroids(classes * features);
  for (float& c : centroids) c = static_cast<float>(kCentroidStd * standard_normal(centroid_rng));

  at::Tensor inputs = torch::empty({samples, features}, torch::kFloat32);
  at::Tensor targets = torch::empty({samples}, torch::kInt64);
  float* x = inputs.data_ptr<float>();
  int64_t* y = targets.data_ptr<int64_t>();
  for (int64_t i = 0; i < samples; ++i) {
    const int64_t label = static_cast<int64_t>(uniform_below(example_rng, classes));
    y[i] = label;
    const float* centre = centroids.data() + label * features;
    for (int64_t f = 0; f < features; ++f) {
      x[i * features + f] = centre[f] + static_cast<float>(standard_normal(example_rng));
    }
  }

  DataSplits splits;
  split_tail(splits, inputs, targets, n_test);
  splits.input_shape = {features};
  splits.num_classes = classes;
  splits.language_model = false;
  return splits;
}

}  // namespace krab::data
