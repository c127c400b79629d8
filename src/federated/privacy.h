// Client-level differential privacy for federated rounds (DP-FedAvg, McMahan et al. 2018).
//
// The mechanism, per round:
//   1. the server samples each client independently with probability q
//      (poisson_sample_clients() from secure_random64(), so the cohort is Poisson-sampled and
//      unpredictable, as the accountant's amplification by subsampling assumes);
//   2. every sampled client's update is clipped to L2 norm C: clip_to_norm(update, C);
//   3. the clipped updates are summed (in the clear, or under secure aggregation, which reveals
//      only the sum) and Gaussian noise of standard deviation sigma * C is added to the sum:
//      add_gaussian_noise(sum, sigma * C, generator);
//   4. the noisy sum divided by the expected cohort size (q times the population) is the
//      round's update; dividing by the actual count would leak it.
// Then one RdpAccountant::step(sigma, q) per round tracks the spent (epsilon, delta); see
// accountant.h, which this header includes, for the accounting itself.
//
// sigma is the noise multiplier. A client's influence on the sum is at most C after clipping, so
// noise sigma * C gives each round the privacy of a Gaussian mechanism with multiplier sigma,
// whatever C is; the unit protected is one client (all of its data), not one example.
//
// Tensors: 1-D float32 updates on any device; results are new tensors (inputs untouched).
// Errors: InvalidArgument naming the argument (a non-positive C, a negative stddev). Pure
// functions apart from the noise source, which belongs to one thread.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "federated/accountant.h"
#include "federated/secure_noise.h"

namespace krab::federated {

struct ClipResult {
  at::Tensor clipped;  // update * min(1, C / norm): same direction, norm <= C
  double norm = 0;     // the original L2 norm (for logs and adaptive clipping)
};

// Scales `update` down to L2 norm `max_norm` (C > 0, finite) if it is longer; a copy is returned
// either way. A zero update stays zero. The norm is computed in double.
ClipResult clip_to_norm(const at::Tensor& update, double max_norm);

// Returns sum + N(0, stddev^2) elementwise (stddev >= 0; 0 returns a copy), the noise drawn by
// `source` (secure_noise.h: a ChaCha20 stream under a key from the OS, sampled so that the
// floating-point values do not give the noiseless sum away). Computed in double, added in sum's
// dtype, on sum's device. Pass sigma * C as `stddev` for the mechanism above.
at::Tensor add_gaussian_noise(const at::Tensor& sum, double stddev, SecureNoise& source);
// The same with a fresh SecureNoise (a new OS key): what DP noise uses. No seed goes in, so no
// seed can bring the noise back.
at::Tensor add_gaussian_noise(const at::Tensor& sum, double stddev);

// 64 uniformly random bits from libsodium's CSPRNG (the OS source), for draws that must be
// unpredictable to everyone, such as DP cohorts (poisson_sample_clients). Thread-safe.
uint64_t secure_random64();

}  // namespace krab::federated
