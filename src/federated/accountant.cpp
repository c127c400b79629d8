// The sampled Gaussian mechanism's RDP, after Mironov, Talwar & Zhang (2019), Section 3.3.
//
// With mu0 = N(0, sigma^2), mu1 = N(1, sigma^2) and mu = (1 - q) mu0 + q mu1, the RDP at order
// alpha is log(A_alpha) / (alpha - 1) where A_alpha = E_{z ~ mu0}[(mu(z) / mu0(z))^alpha].
// Both reference implementations (TF Privacy rdp_accountant.py, Opacus analysis/rdp.py) evaluate
// A_alpha the same way and this file follows them step for step, including the -30 stopping
// rule of the fractional series, so that the numbers agree with theirs and not merely "to within
// the bound's slack".
#include "federated/accountant.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/errors.h"

namespace krab::federated {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// log(exp(a) + exp(b)) without overflow; -inf is log(0).
double log_add(double a, double b) {
  const double lo = std::min(a, b), hi = std::max(a, b);
  if (lo == -kInf) return hi;
  return std::log1p(std::exp(lo - hi)) + hi;
}

// log(exp(a) - exp(b)) for a >= b.
double log_sub(double a, double b) {
  // Both references raise here: a partial sum of A_alpha going negative would mean the series
  // was evaluated wrongly, not that the input was bad.
  KRAB_CHECK(a >= b, "log_sub of a larger value (", a, " < ", b, ")");
  if (b == -kInf) return a;
  if (a == b) return -kInf;
  const double d = a - b;
  // expm1 overflows past ~709; exp(a) - exp(b) is exp(a) to double precision long before that.
  if (d > 700) return a;
  return std::log(std::expm1(d)) + b;
}

// log(erfc(x)), accurate where erfc underflows (x > ~26 gives 0 in double).
double log_erfc(double x) {
  if (x < 25) return std::log(std::erfc(x));
  // Asymptotic (Laurent) series of log(erfc(x)) at infinity, the one TF Privacy falls back on:
  // error O(x^-10), below 1e-14 here.
  const double x2 = x * x;
  return -0.5 * std::log(M_PI) - std::log(x) - x2 - 0.5 / x2 + 0.625 / (x2 * x2) -
         37.0 / 24.0 / (x2 * x2 * x2) + 353.0 / 64.0 / (x2 * x2 * x2 * x2);
}

double log_binom(double n, double k) {
  return std::lgamma(n + 1) - std::lgamma(k + 1) - std::lgamma(n - k + 1);
}

// Integer alpha: A_alpha = sum_i C(alpha, i) q^i (1-q)^(alpha-i) exp((i^2 - i) / (2 sigma^2)),
// every term positive, so a plain log-space sum is exact up to rounding.
double log_a_int(double q, double sigma, int64_t alpha) {
  double log_a = -kInf;
  const double log_q = std::log(q), log_1q = std::log1p(-q);
  for (int64_t i = 0; i <= alpha; ++i) {
    const double di = static_cast<double>(i);
    const double log_coef =
        log_binom(static_cast<double>(alpha), di) + di * log_q + (alpha - di) * log_1q;
    log_a = log_add(log_a, log_coef + (di * di - di) / (2 * sigma * sigma));
  }
  return log_a;
}

// Fractional alpha: the integral is split at z0, where q mu1(z) = (1 - q) mu0(z); on each side
// (mu / mu0)^alpha has a convergent binomial series, whose coefficients C(alpha, i) alternate in
// sign once i > alpha, so each term is added or subtracted by that sign. The coefficient is built
// by the recurrence C(alpha, i+1) = C(alpha, i) (alpha - i) / (i + 1) in log space (sign tracked
// separately): it stays finite where Gamma(alpha + 1) alone would overflow.
double log_a_frac(double q, double sigma, double alpha) {
  double log_a0 = -kInf, log_a1 = -kInf;
  const double z0 = sigma * sigma * std::log(1 / q - 1) + 0.5;
  const double log_q = std::log(q), log_1q = std::log1p(-q);
  const double s2 = std::sqrt(2.0) * sigma;
  double log_coef = 0;  // log|C(alpha, 0)|
  bool positive = true;
  for (int64_t i = 0;; ++i) {
    const double di = static_cast<double>(i);
    const double j = alpha - di;
    const double log_t0 = log_coef + di * log_q + j * log_1q;
    const double log_t1 = log_coef + j * log_q + di * log_1q;
    const double log_e0 = std::log(0.5) + log_erfc((di - z0) / s2);
    const double log_e1 = std::log(0.5) + log_erfc((z0 - j) / s2);
    const double log_s0 = log_t0 + (di * di - di) / (2 * sigma * sigma) + log_e0;
    const double log_s1 = log_t1 + (j * j - j) / (2 * sigma * sigma) + log_e1;
    if (positive) {
      log_a0 = log_add(log_a0, log_s0);
      log_a1 = log_add(log_a1, log_s1);
    } else {
      log_a0 = log_sub(log_a0, log_s0);
      log_a1 = log_sub(log_a1, log_s1);
    }
    if (std::max(log_s0, log_s1) < -30) break;
    // Next coefficient. alpha is not an integer, so alpha - i is never 0.
    log_coef += std::log(std::abs(alpha - di)) - std::log(di + 1);
    if (alpha - di < 0) positive = !positive;
    KRAB_CHECK(i < 100000, "fractional RDP series did not converge (q=", q, ", sigma=", sigma,
               ", alpha=", alpha, ")");
  }
  return log_add(log_a0, log_a1);
}

void check_noise(double noise_multiplier) {
  KRAB_CHECK_ARG(std::isfinite(noise_multiplier) && noise_multiplier > 0,
                 "noise multiplier (--noise-multiplier) must be a finite number > 0, got ",
                 noise_multiplier);
}

void check_rate(double sampling_rate) {
  KRAB_CHECK_ARG(sampling_rate > 0 && sampling_rate <= 1,
                 "sampling rate (--sampling-rate) must be in (0, 1], got ", sampling_rate);
}

void check_delta(double delta) {
  KRAB_CHECK_ARG(delta > 0 && delta < 1, "delta (--delta) must be in (0, 1), got ", delta);
}

void check_orders(const std::vector<double>& orders) {
  KRAB_CHECK_ARG(!orders.empty(), "RDP orders: the list is empty");
  for (double a : orders) {
    KRAB_CHECK_ARG(std::isfinite(a) && a > 1, "RDP orders: each must be finite and > 1, got ", a);
  }
}

}  // namespace

const std::vector<double>& default_orders() {
  static const std::vector<double> orders = [] {
    std::vector<double> o;
    // Written as Opacus writes it (1 + x / 10.0) so the doubles are the same ones.
    for (int x = 1; x < 100; ++x) o.push_back(1 + x / 10.0);
    for (int a = 12; a < 64; ++a) o.push_back(a);
    return o;
  }();
  return orders;
}

double rdp_sampled_gaussian(double noise_multiplier, double sampling_rate, double order) {
  check_noise(noise_multiplier);
  KRAB_CHECK_ARG(sampling_rate >= 0 && sampling_rate <= 1,
                 "sampling rate (--sampling-rate) must be in [0, 1], got ", sampling_rate);
  KRAB_CHECK_ARG(std::isfinite(order) && order > 1, "RDP order must be finite and > 1, got ",
                 order);
  const double q = sampling_rate, sigma = noise_multiplier;
  // The un-subsampled bound alpha / (2 sigma^2) caps every term of the series; where it is not a
  // finite double (sigma^2 underflows), no epsilon can be reported, only a refusal.
  KRAB_CHECK_ARG(std::isfinite(order / (2 * sigma * sigma)),
                 "noise multiplier (--noise-multiplier) ", sigma,
                 " is too small to account for: epsilon would be infinite");
  if (q == 0) return 0;
  if (q == 1) return order / (2 * sigma * sigma);
  // Same integer test as the references (float(alpha).is_integer()).
  const double log_a = order == std::floor(order) ? log_a_int(q, sigma, static_cast<int64_t>(order))
                                                  : log_a_frac(q, sigma, order);
  return log_a / (order - 1);
}

std::vector<double> compute_rdp(double noise_multiplier, double sampling_rate, int64_t steps,
                                const std::vector<double>& orders) {
  KRAB_CHECK_ARG(steps >= 0, "steps (--steps) must be >= 0, got ", steps);
  check_orders(orders);
  std::vector<double> rdp;
  rdp.reserve(orders.size());
  for (double a : orders) {
    rdp.push_back(rdp_sampled_gaussian(noise_multiplier, sampling_rate, a) *
                  static_cast<double>(steps));
  }
  return rdp;
}

PrivacySpent rdp_to_epsilon(const std::vector<double>& orders, const std::vector<double>& rdp,
                            double delta, RdpConversion conversion) {
  check_orders(orders);
  KRAB_CHECK_ARG(orders.size() == rdp.size(), "rdp_to_epsilon: ", orders.size(), " orders but ",
                 rdp.size(), " RDP values");
  check_delta(delta);
  PrivacySpent best{kInf, orders.front()};
  const double log_delta = std::log(delta);
  for (size_t i = 0; i < orders.size(); ++i) {
    const double a = orders[i], r = rdp[i];
    KRAB_CHECK_ARG(!(r < 0), "rdp_to_epsilon: RDP must be >= 0, got ", r, " at order ", a);
    if (std::isnan(r)) continue;  // as Opacus' nanargmin
    const double eps = conversion == RdpConversion::kBalle2020
                           ? r - (log_delta + std::log(a)) / (a - 1) + std::log((a - 1) / a)
                           : r - log_delta / (a - 1);
    // Strict <: ties go to the first (smallest) order, like argmin.
    if (eps < best.epsilon) best = {eps, a};
  }
  best.epsilon = std::max(0.0, best.epsilon);
  return best;
}

PrivacySpent privacy_spent(double noise_multiplier, double sampling_rate, int64_t steps,
                           double delta, RdpConversion conversion) {
  check_noise(noise_multiplier);
  check_rate(sampling_rate);
  KRAB_CHECK_ARG(steps >= 1, "steps (--steps) must be >= 1, got ", steps);
  check_delta(delta);
  const auto& orders = default_orders();
  return rdp_to_epsilon(orders, compute_rdp(noise_multiplier, sampling_rate, steps, orders), delta,
                        conversion);
}

RdpAccountant::RdpAccountant(std::vector<double> orders) : orders_(std::move(orders)) {
  check_orders(orders_);
}

void RdpAccountant::step(double noise_multiplier, double sampling_rate, int64_t steps) {
  check_noise(noise_multiplier);
  check_rate(sampling_rate);
  KRAB_CHECK_ARG(steps >= 1, "steps must be >= 1, got ", steps);
  total_steps_ += steps;
  if (!history_.empty() && history_.back().noise_multiplier == noise_multiplier &&
      history_.back().sampling_rate == sampling_rate) {
    history_.back().steps += steps;
    return;
  }
  history_.push_back({noise_multiplier, sampling_rate, steps});
  for (size_t i = 0; i < per_round_.size(); ++i) {
    if (history_[i].noise_multiplier == noise_multiplier &&
        history_[i].sampling_rate == sampling_rate) {
      per_round_.push_back(per_round_[i]);
      return;
    }
  }
  per_round_.push_back(compute_rdp(noise_multiplier, sampling_rate, 1, orders_));
}

std::vector<double> RdpAccountant::rdp() const {
  std::vector<double> total(orders_.size(), 0.0);
  for (size_t e = 0; e < history_.size(); ++e) {
    for (size_t i = 0; i < total.size(); ++i) {
      total[i] += per_round_[e][i] * static_cast<double>(history_[e].steps);
    }
  }
  return total;
}

PrivacySpent RdpAccountant::privacy_spent(double delta, RdpConversion conversion) const {
  check_delta(delta);
  if (history_.empty()) return {0.0, orders_.front()};
  return rdp_to_epsilon(orders_, rdp(), delta, conversion);
}

}  // namespace krab::federated
