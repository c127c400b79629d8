// Rényi-DP accounting for the Poisson-subsampled Gaussian mechanism.
//
// The mechanism: each round every client (or example) is included independently with
// probability q (the sampling rate), each included contribution is clipped to L2 norm C, the
// clipped contributions are summed and Gaussian noise of standard deviation sigma * C is added
// (sigma is the noise multiplier; see privacy.h for the clipping and noise themselves). This
// file answers "how much privacy did T such rounds spend": an (epsilon, delta) guarantee.
//
// How. The mechanism's Rényi divergence of order alpha (its RDP) is computed per round, RDP
// composes by addition over rounds, and the total is converted to (epsilon, delta) at the best
// order of a fixed list. The per-round RDP is the tight bound of Mironov, Talwar and Zhang,
// "Rényi Differential Privacy of the Sampled Gaussian Mechanism" (2019), computed exactly as
// TensorFlow Privacy's rdp_accountant.compute_rdp and Opacus' accountants/analysis/rdp.py do:
//   - integer orders: the binomial expansion of A_alpha, summed in log space;
//   - fractional orders: the two-series formula split at z0 = sigma^2 log(1/q - 1) + 1/2;
//   - q = 1 (no subsampling): the Gaussian mechanism's alpha / (2 sigma^2).
// So krab's epsilons match theirs to floating-point accuracy for the same orders (the tests
// check published values from both).
//
// Conversion to (epsilon, delta), minimised over the orders:
//   kBalle2020     eps = rdp - (log(delta) + log(alpha)) / (alpha - 1) + log((alpha - 1) / alpha)
//                  Balle et al., "Hypothesis testing interpretations and Rényi differential
//                  privacy" (2020), Thm 21. What Opacus and Google's dp_accounting use today.
//                  The default.
//   kMironov2017   eps = rdp - log(delta) / (alpha - 1)
//                  Mironov, "Rényi Differential Privacy" (2017), Prop. 3. Looser (larger eps);
//                  what TF Privacy printed before 2020. Here to reproduce older published
//                  numbers, not to report new ones.
// A negative result (possible only for tiny RDP with a large delta) is reported as 0.
//
// Units: everything is in nats (natural logs), as in both reference libraries.
//
// Errors: every argument is checked; a bad one throws krab::InvalidArgument whose message
// names it the way the CLI spells it (`--noise-multiplier`, `--sampling-rate`, `--steps`,
// `--delta`). Pure functions and a small value class: no torch, no I/O, no global state;
// RdpAccountant is not thread-safe (one owner, like any value).
#pragma once

#include <cstdint>
#include <vector>

namespace krab::federated {

enum class RdpConversion { kBalle2020, kMironov2017 };

// Opacus' RDPAccountant.DEFAULT_ALPHAS: 1.1, 1.2, ..., 10.9 (99 orders), then 12, 13, ..., 63.
// Also the list TF Privacy's MNIST tutorials use. 150 orders, ascending.
const std::vector<double>& default_orders();

// RDP of ONE round of the sampled Gaussian mechanism at `order` (> 1, finite), in nats.
// `sampling_rate` in [0, 1] (0 gives 0), `noise_multiplier` > 0.
double rdp_sampled_gaussian(double noise_multiplier, double sampling_rate, double order);

// RDP of `steps` rounds at each of `orders` (steps x the one-round value; TF Privacy's
// compute_rdp(q, noise_multiplier, steps, orders)). `steps` >= 0.
std::vector<double> compute_rdp(double noise_multiplier, double sampling_rate, int64_t steps,
                                const std::vector<double>& orders);

struct PrivacySpent {
  double epsilon = 0;  // the smallest over the orders; +inf if every order gives +inf
  double order = 0;    // the order that achieved it
};

// Converts accumulated RDP (rdp[i] at orders[i]) to epsilon at `delta` in (0, 1).
PrivacySpent rdp_to_epsilon(const std::vector<double>& orders, const std::vector<double>& rdp,
                            double delta, RdpConversion conversion = RdpConversion::kBalle2020);

// The one-call form the CLI uses (`krab privacy epsilon --noise-multiplier S --sampling-rate Q
// --steps T --delta D`): epsilon after `steps` rounds at (noise_multiplier, sampling_rate),
// default_orders(). Requires noise_multiplier > 0, 0 < sampling_rate <= 1, steps >= 1,
// 0 < delta < 1, each named by its CLI flag when violated.
PrivacySpent privacy_spent(double noise_multiplier, double sampling_rate, int64_t steps,
                           double delta, RdpConversion conversion = RdpConversion::kBalle2020);
inline double epsilon(double noise_multiplier, double sampling_rate, int64_t steps, double delta) {
  return privacy_spent(noise_multiplier, sampling_rate, steps, delta).epsilon;
}

// Accumulates rounds whose noise and sampling rate may change (adaptive clipping, a new cohort
// size), like Opacus' RDPAccountant. A checkpoint stores history(); a restore replays it through
// step() and gets the same history and so bit-identical epsilons (the total is always summed
// entry by entry, in history order).
class RdpAccountant {
 public:
  struct Entry {
    double noise_multiplier;
    double sampling_rate;
    int64_t steps;
  };

  // `orders`: non-empty, each finite and > 1.
  explicit RdpAccountant(std::vector<double> orders = default_orders());

  // Records `steps` (>= 1) rounds at (noise_multiplier > 0, 0 < sampling_rate <= 1). A call
  // with the same parameters as the last entry extends that entry.
  void step(double noise_multiplier, double sampling_rate, int64_t steps = 1);

  PrivacySpent privacy_spent(double delta,
                             RdpConversion conversion = RdpConversion::kBalle2020) const;
  double epsilon(double delta) const { return privacy_spent(delta).epsilon; }

  // Accumulated RDP, one value per order.
  std::vector<double> rdp() const;
  int64_t total_steps() const { return total_steps_; }
  const std::vector<double>& orders() const { return orders_; }
  const std::vector<Entry>& history() const { return history_; }

 private:
  std::vector<double> orders_;
  std::vector<Entry> history_;
  // One-round RDP per history entry (same index). Federated runs repeat one (noise, rate) pair
  // for hundreds of rounds and the fractional orders' series is the expensive part, so it is
  // computed once per distinct pair.
  std::vector<std::vector<double>> per_round_;
  int64_t total_steps_ = 0;
};

}  // namespace krab::federated
