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

// The level T at which Σ_r clamp((T − a_r) / c_r, lo_r, hi_r) = total (every c_r > 0). The sum is
// continuous, nondecreasing and piecewise linear in T, with a kink where some rank's time
// a_r + c_r · n reaches lo_r or hi_r; at the lowest kink it is Σ lo ≤ total and past the last
// Σ hi ≥ total. So walk the kinks in order and interpolate linearly inside the first interval
// that reaches total: exact up to rounding, and no iteration count to tune (a bisection would be
// just as deterministic, but less exact).
double water_level(const std::vector<StepTimeModel>& model, const std::vector<double>& lo,
                   const std::vector<double>& hi, double total) {
  const auto filled = [&](double level) {
    double sum = 0;
    for (size_t r = 0; r < model.size(); ++r)
      sum += std::clamp((level - model[r].fixed_us) / model[r].per_example_us, lo[r], hi[r]);
    return sum;
  };
  std::vector<double> kinks;
  for (size_t r = 0; r < model.size(); ++r) {
    kinks.push_back(model[r].at(lo[r]));
    kinks.push_back(model[r].at(hi[r]));
  }
  std::sort(kinks.begin(), kinks.end());
  double prev = kinks.front();
  double at_prev = filled(prev);
  if (at_prev >= total) return prev;
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

// The integer split nearest the quotas in predicted time: floors (all within [lo, hi], the
// bounds being integers), then each example left over to the rank whose time after taking it is
// least. Every floored example costs at most the level T and every example not yet given costs
// at least T, so this hands out the B − Σ lo cheapest examples of all — the minimax optimum.
std::vector<int64_t> round_by_time(const std::vector<double>& quota,
                                   const std::vector<StepTimeModel>& model,
                                   const std::vector<double>& hi, int64_t total) {
  std::vector<int64_t> out;
  int64_t left = total;
  for (double q : quota) {
    out.push_back(static_cast<int64_t>(std::floor(q)));
    left -= out.back();
  }
  KRAB_CHECK(left >= 0, "the quotas' floors exceed the global batch by ", -left);
  for (; left > 0; --left) {
    size_t best = quota.size();
    for (size_t r = 0; r < quota.size(); ++r) {
      if (static_cast<double>(out[r]) >= hi[r]) continue;
      if (best == quota.size() || model[r].at(static_cast<double>(out[r] + 1)) <
                                      model[best].at(static_cast<double>(out[best] + 1)))
        best = r;
    }
    KRAB_CHECK(best < quota.size(), "no rank can take another example within its bound");
    ++out[best];
  }
  return out;
}

void check_history(const BalanceHistory& history, size_t world) {
  if (history.empty() && history.compute_us.empty()) return;
  KRAB_CHECK_ARG(history.sizes.size() == world && history.compute_us.size() == world,
                 "rebalance: a history of ", history.sizes.size(), " sizes and ",
                 history.compute_us.size(), " times for ", world,
                 " slices (a new world starts with an empty history)");
  for (size_t r = 0; r < world; ++r)
    KRAB_CHECK_ARG(history.sizes[r] >= 1 && history.compute_us[r] >= 0, "rebalance: rank ", r,
                   "'s history window has ", history.sizes[r], " examples in ",
                   history.compute_us[r], " us");
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

StepTimeModel fit_step_time(int64_t n, int64_t t_us, int64_t earlier_n, int64_t earlier_t_us) {
  KRAB_CHECK_ARG(n >= 1, "fit_step_time: a window of ", n, " examples");
  const double t = static_cast<double>(std::max<int64_t>(t_us, 1));
  const StepTimeModel proportional{0, t / static_cast<double>(n)};
  if (earlier_n < 1 || earlier_n == n) return proportional;
  const double earlier_t = static_cast<double>(std::max<int64_t>(earlier_t_us, 1));
  double slope = (t - earlier_t) / static_cast<double>(n - earlier_n);
  // The floor is below t / n, so the intercept it leaves is positive.
  slope = std::max(slope, kMinSlopeShare * t / static_cast<double>(n));
  const double fixed = t - slope * static_cast<double>(n);
  if (fixed < 0) return proportional;
  return {fixed, slope};
}

Rebalance rebalance(const std::vector<int64_t>& sizes, const std::vector<int64_t>& compute_us,
                    double max_change, const BalanceHistory& history) {
  check_sizes(sizes, "rebalance");
  KRAB_CHECK_ARG(compute_us.size() == sizes.size(), "rebalance: ", compute_us.size(),
                 " compute times for ", sizes.size(), " slices");
  KRAB_CHECK_ARG(std::isfinite(max_change) && max_change >= 0, "rebalance: max_change ", max_change,
                 " must be a finite fraction >= 0");
  const int64_t total = checked_total(sizes, "rebalance");
  const size_t world = sizes.size();
  check_history(history, world);
  const auto step = static_cast<int64_t>(
      std::floor(max_change * static_cast<double>(total) / static_cast<double>(world)));

  Rebalance out;
  std::vector<double> lo(world), hi(world);
  double now = 0;
  for (size_t r = 0; r < world; ++r) {
    KRAB_CHECK_ARG(compute_us[r] >= 0, "rebalance: rank ", r, "'s compute time is ", compute_us[r],
                   " us");
    out.model.push_back(history.empty() ? fit_step_time(sizes[r], compute_us[r], 0, 0)
                                        : fit_step_time(sizes[r], compute_us[r], history.sizes[r],
                                                        history.compute_us[r]));
    now = std::max(now, static_cast<double>(std::max<int64_t>(compute_us[r], 1)));
    lo[r] = static_cast<double>(std::max<int64_t>(1, sizes[r] - step));
    hi[r] = static_cast<double>(sizes[r] + step);
  }
  const double level = water_level(out.model, lo, hi, static_cast<double>(total));
  std::vector<double> quota(world);
  for (size_t r = 0; r < world; ++r)
    quota[r] =
        std::clamp((level - out.model[r].fixed_us) / out.model[r].per_example_us, lo[r], hi[r]);
  std::vector<int64_t> next = round_by_time(quota, out.model, hi, total);

  double after = 0;
  for (size_t r = 0; r < world; ++r) {
    KRAB_CHECK(static_cast<double>(next[r]) >= lo[r] && static_cast<double>(next[r]) <= hi[r],
               "rank ", r, ": ", next[r], " outside [", lo[r], ", ", hi[r], "]");
    after = std::max(after, out.model[r].at(static_cast<double>(next[r])));
  }
  out.predicted_gain = (now - after) / now;
  out.changed = next != sizes && out.predicted_gain >= kMinGain;
  out.sizes = out.changed ? std::move(next) : sizes;

  // A rank whose size stays keeps the earlier window at another size, so that its fit survives.
  for (size_t r = 0; r < world; ++r) {
    const bool keep = !history.empty() && out.sizes[r] == sizes[r] && history.sizes[r] != sizes[r];
    out.history.sizes.push_back(keep ? history.sizes[r] : sizes[r]);
    out.history.compute_us.push_back(keep ? history.compute_us[r] : compute_us[r]);
  }
  return out;
}

}  // namespace krab::elastic
