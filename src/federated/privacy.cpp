// Clipping and noise. The accountant that turns (sigma, q, rounds) into epsilon is in
// accountant.cpp, which has no torch dependency.
#include "federated/privacy.h"

#include <ATen/ATen.h>
#include <sodium.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/errors.h"

namespace krab::federated {

ClipResult clip_to_norm(const at::Tensor& update, double max_norm) {
  KRAB_CHECK_ARG(std::isfinite(max_norm) && max_norm > 0,
                 "clip_to_norm: max_norm (the clipping bound C) must be finite and > 0, got ",
                 max_norm);
  KRAB_CHECK_ARG(update.defined() && update.dim() == 1 && update.scalar_type() == at::kFloat,
                 "clip_to_norm: update must be a 1-D float32 tensor");
  // In double: a float32 sum of squares overflows for norms above ~1.8e19, and an update that
  // large is exactly the kind clipping exists for.
  const double norm =
      at::linalg_vector_norm(update, 2, c10::nullopt, false, at::kDouble).item<double>();
  KRAB_CHECK_ARG(std::isfinite(norm), "clip_to_norm: update has non-finite values (norm ", norm,
                 "); validate updates first");
  if (norm <= max_norm) return {update.clone(), norm};
  at::Tensor clipped = update * (max_norm / norm);
  // float32 rounding of the scaled values can land a hair above C. The DP guarantee is stated
  // for norm <= C exactly, so pull such a result back by a few ulps.
  const double after =
      at::linalg_vector_norm(clipped, 2, c10::nullopt, false, at::kDouble).item<double>();
  if (after > max_norm) {
    clipped.mul_(max_norm / after * (1 - 4 * std::numeric_limits<float>::epsilon()));
  }
  return {clipped, norm};
}

at::Tensor add_gaussian_noise(const at::Tensor& sum, double stddev, SecureNoise& source) {
  KRAB_CHECK_ARG(std::isfinite(stddev) && stddev >= 0,
                 "add_gaussian_noise: stddev (sigma * C) must be finite and >= 0, got ", stddev);
  KRAB_CHECK_ARG(sum.defined() && sum.is_floating_point(),
                 "add_gaussian_noise: sum must be a floating-point tensor");
  if (stddev == 0) return sum.clone();
  at::Tensor noise = at::empty(sum.sizes(), at::TensorOptions().dtype(at::kDouble));
  source.gaussian(stddev, noise.data_ptr<double>(), static_cast<size_t>(noise.numel()));
  return (sum.to(at::kDouble) + noise.to(sum.device())).to(sum.scalar_type());
}

at::Tensor add_gaussian_noise(const at::Tensor& sum, double stddev) {
  SecureNoise source;
  return add_gaussian_noise(sum, stddev, source);
}

uint64_t secure_random64() {
  KRAB_CHECK(sodium_init() >= 0, "libsodium failed to initialise");
  uint64_t v = 0;
  randombytes_buf(&v, sizeof v);
  return v;
}

}  // namespace krab::federated
