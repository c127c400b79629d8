#include "elastic/slices.h"

#include <algorithm>
#include <cmath>

#include "core/errors.h"

namespace krab::elastic {
namespace {

// Integers up to 2^53 are exact in a double, so W · n_r / B is the correctly rounded quotient of
// two exact integers, and 1.0 exactly when W · n_r == B.
constexpr int64_t kExactInDouble = int64_t{1} << 53;

void check_sizes(const std::vector<int64_t>& sizes, const char* who) {
  KRAB_CHECK_ARG(!sizes.empty(), who, ": no slices (a world of 0 ranks)");
  for (size_t r = 0; r < sizes.size(); ++r)
    KRAB_CHECK_ARG(sizes[r] >= 1, who, ": rank ", r, "'s slice has ", sizes[r],
                   " examples; every member needs at least 1");
}

int64_t checked_total(const std::vector<int64_t>& sizes, const char* who) {
  int64_t total = 0;
  for (int64_t n : sizes)
    KRAB_CHECK_ARG(!__builtin_add_overflow(total, n, &total) && total <= kExactInDouble, who,
                   ": the global batch exceeds 2^53 examples");
  return total;
}

// The λ at which Σ_r clamp(λ · s_r, lo_r, hi_r) = total. The sum is continuous, nondecreasing
// and piecewise linear in λ, with a kink where some λ · s_r crosses lo_r or hi_r; at λ = 0 it is
// Σ lo ≤ total and past the last kink Σ hi ≥ total. So walk the kinks in order and interpolate
// linearly inside the first interval that reaches total: exact up to rounding, and no iteration
// count to tune (a bisection would be just as deterministic, but less exact).
double water_level(const std::vector<double>& speed, const std::vector<double>& lo,
                   const std::vector<double>& hi, double total) {
  const auto filled = [&](double level) {
    double sum = 0;
    for (size_t r = 0; r < speed.size(); ++r) sum += std::clamp(level * speed[r], lo[r], hi[r]);
    return sum;
  };
  std::vector<double> kinks;
  for (size_t r = 0; r < speed.size(); ++r) {
    kinks.push_back(lo[r] / speed[r]);
    kinks.push_back(hi[r] / speed[r]);
  }
  std::sort(kinks.begin(), kinks.end());
  double prev = 0;
  double at_prev = filled(0);
  for (double kink : kinks) {
    const double at_kink = filled(kink);
    if (at_kink >= total) {
      if (at_kink == at_prev) return kink;
      return prev + (kink - prev) * (total - at_prev) / (at_kink - at_prev);
    }
    prev = kink;
    at_prev = at_kink;
  }
  return kinks.back();
}

}  // namespace

std::vector<int64_t> equal_sizes(int64_t global_batch, int world) {
  KRAB_CHECK_ARG(world >= 1 && world <= global_batch, "slices: a global batch of ", global_batch,
                 " examples cannot give each of ", world, " ranks at least one");
  std::vector<int64_t> sizes(static_cast<size_t>(world), global_batch / world);
  for (int64_t r = 0; r < global_batch % world; ++r) ++sizes[static_cast<size_t>(r)];
  return sizes;
}

std::vector<RankSlice> plan_slices(const std::vector<int64_t>& sizes) {
  check_sizes(sizes, "plan_slices");
  const int64_t total = checked_total(sizes, "plan_slices");
  const auto world = static_cast<int64_t>(sizes.size());
  std::vector<RankSlice> out;
  int64_t begin = 0;
  for (int64_t n : sizes) {
    int64_t scaled = 0;
    KRAB_CHECK_ARG(!__builtin_mul_overflow(world, n, &scaled) && scaled <= kExactInDouble,
                   "plan_slices: ", world, " ranks x ", n, " examples exceeds 2^53");
    out.push_back({begin, begin + n, static_cast<double>(scaled) / static_cast<double>(total)});
    begin += n;
  }
  return out;
}

std::vector<RankSlice> plan_slices(int64_t global_batch, int world) {
  return plan_slices(equal_sizes(global_batch, world));
}

std::vector<int64_t> largest_remainder(const std::vector<double>& quotas, int64_t total) {
  double sum = 0;
  for (double q : quotas) {
    KRAB_CHECK_ARG(std::isfinite(q) && q >= 0, "largest_remainder: quota ", q,
                   " is negative or not finite");
    sum += q;
  }
  const double slack = 1e-9 * std::max(1.0, static_cast<double>(total));
  KRAB_CHECK_ARG(std::abs(sum - static_cast<double>(total)) <= slack,
                 "largest_remainder: the quotas sum to ", sum, ", not ", total);
  std::vector<int64_t> out;
  int64_t left = total;
  for (double q : quotas) {
    out.push_back(static_cast<int64_t>(std::floor(q)));
    left -= out.back();
  }
  // Stable: equal fractional parts keep index order, which is the tie rule.
  std::vector<size_t> order(quotas.size());
  for (size_t r = 0; r < order.size(); ++r) order[r] = r;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return quotas[a] - std::floor(quotas[a]) > quotas[b] - std::floor(quotas[b]);
  });
  KRAB_CHECK_ARG(left >= 0 && left <= static_cast<int64_t>(quotas.size()),
                 "largest_remainder: ", left, " units left over for ", quotas.size(), " quotas");
  for (int64_t k = 0; k < left; ++k) ++out[order[static_cast<size_t>(k)]];
  return out;
}

Rebalance rebalance(const std::vector<int64_t>& sizes, const std::vector<int64_t>& compute_us,
                    double max_change) {
  check_sizes(sizes, "rebalance");
  KRAB_CHECK_ARG(compute_us.size() == sizes.size(), "rebalance: ", compute_us.size(),
                 " compute times for ", sizes.size(), " slices");
  KRAB_CHECK_ARG(std::isfinite(max_change) && max_change >= 0, "rebalance: max_change ", max_change,
                 " must be a finite fraction >= 0");
  const int64_t total = checked_total(sizes, "rebalance");
  const size_t world = sizes.size();
  const auto step = static_cast<int64_t>(
      std::floor(max_change * static_cast<double>(total) / static_cast<double>(world)));

  std::vector<double> time(world), speed(world), lo(world), hi(world);
  for (size_t r = 0; r < world; ++r) {
    KRAB_CHECK_ARG(compute_us[r] >= 0, "rebalance: rank ", r, "'s compute time is ", compute_us[r],
                   " us");
    // A slice measured at 0 us (a clock too coarse for it) is counted as 1 us: fast, finite.
    time[r] = static_cast<double>(std::max<int64_t>(compute_us[r], 1));
    speed[r] = static_cast<double>(sizes[r]) / time[r];
    lo[r] = static_cast<double>(std::max<int64_t>(1, sizes[r] - step));
    hi[r] = static_cast<double>(sizes[r] + step);
  }
  const double level = water_level(speed, lo, hi, static_cast<double>(total));
  std::vector<double> quota(world);
  for (size_t r = 0; r < world; ++r) quota[r] = std::clamp(level * speed[r], lo[r], hi[r]);
  std::vector<int64_t> next = largest_remainder(quota, total);

  // Bounds are integers and quotas lie within them, so the floor stays >= lo and a unit added
  // to a fractional quota stays <= hi.
  double now = 0, after = 0;
  for (size_t r = 0; r < world; ++r) {
    KRAB_CHECK(static_cast<double>(next[r]) >= lo[r] && static_cast<double>(next[r]) <= hi[r],
               "rank ", r, ": ", next[r], " outside [", lo[r], ", ", hi[r], "]");
    now = std::max(now, time[r]);
    after = std::max(after, time[r] * static_cast<double>(next[r]) / static_cast<double>(sizes[r]));
  }
  Rebalance out;
  out.predicted_gain = (now - after) / now;
  if (next == sizes || out.predicted_gain < kMinGain) {
    out.sizes = sizes;
    return out;
  }
  out.sizes = std::move(next);
  out.changed = true;
  return out;
}

}  // namespace krab::elastic
