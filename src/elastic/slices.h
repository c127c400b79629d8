// How the fixed global batch is split among the current members, and how the load balancer
// moves the split (docs/design/elastic.md §5). Pure: integers in, integers (and one double per
// rank) out; no tensors, no communication. Every rank calls these with the same inputs — the
// generation's member count, the sizes it already uses, the compute times the commit vote
// summed — and so computes the same slices bit for bit (same binary, same integers).
//
// The global (micro-)batch B is fixed for the run (`train.batch × parallel.workers`, §5.1);
// only its split changes with the world W or the balancer. Rank r of W takes the contiguous
// examples [begin_r, end_r) of each global micro-batch, in rank order, n_r = end_r − begin_r
// of them, every n_r ≥ 1, and the slices tile [0, B): begin_0 = 0, end_r = begin_{r+1},
// end_{W−1} = B.
//
// The weight (§5.2). Every reduction averages over ranks (kAvg divides by W), and rank r's loss
// is a mean over its n_r examples, so the loop multiplies that loss by
//
//   w_r = W · n_r / B
//
// and the average the reductions take, (1/W) Σ_r w_r g_r = Σ_r (n_r / B) g_r, is the mean
// gradient of the whole global batch whatever the slices. w_r is computed in double from the
// integers W · n_r and B: when the slices are equal (W divides B) it is exactly 1.0, and the loop
// skips the multiplication, so an elastic or balanced run with equal slices is bit-identical to
// a plain one.
//
// The balancer (§5.3): see rebalance() below; it fits each rank's step time as a fixed cost plus
// a cost per example over two windows of different sizes.
//
// The slices are not data::BatchSlice (data/sampler.h) because that header pulls in ATen and
// this layer's plans stay free of torch; the elastic engine copies begin/end into its StepPlan.
#pragma once

#include <cstdint>
#include <vector>

namespace krab::elastic {

// One rank's share of every global micro-batch of a step: examples [begin, end), and the
// weight W · size / B its loss is multiplied by (exactly 1.0 for equal slices).
struct RankSlice {
  int64_t begin = 0;
  int64_t end = 0;
  double weight = 1.0;
  int64_t size() const { return end - begin; }
};

// The equal split of B examples among W ranks: B / W each, and the B mod W examples left over
// go one each to ranks 0, 1, ... (largest remainder of the equal quotas B / W, whose
// remainders tie, broken toward the lower rank). Throws InvalidArgument unless 1 <= world <= B.
std::vector<int64_t> equal_sizes(int64_t global_batch, int world);

// The contiguous slices, in rank order, for slice sizes `sizes` (one per rank, W = its length),
// with their weights W · n_r / B, where B = Σ sizes. Throws InvalidArgument when `sizes` is
// empty, a size is below 1, or W · n_r or B overflows int64 or exceeds 2^53 (where the double
// weight would stop being exact).
std::vector<RankSlice> plan_slices(const std::vector<int64_t>& sizes);

// plan_slices(equal_sizes(global_batch, world)): what next_step() hands out for a generation of
// `world` members without the balancer.
std::vector<RankSlice> plan_slices(int64_t global_batch, int world);

// Rounds real quotas to integers that sum to `total` by the largest-remainder method: each
// quota is floored, and the units left over, total − Σ floor(q_r), go one each to the largest
// fractional parts, ties broken toward the lower index. Among all integer vectors summing to
// `total` it is the one nearest the quotas (Σ |a_r − q_r| and Σ (a_r − q_r)² are both
// smallest); the tie rule makes the choice unique. Throws InvalidArgument when a quota is
// negative or not finite, or when the quotas do not sum to `total` within 1e-9 relative (so
// that fewer than one unit is left over per quota).
std::vector<int64_t> largest_remainder(const std::vector<double>& quotas, int64_t total);

// A rank's compute time per step as the balancer models it: t(n) = fixed_us + per_example_us · n
// for a slice of n examples. fixed_us is what a step costs whatever its slice (an artificial
// delay such as train.slow_delay_ms, per-step overheads); per_example_us is the work per example.
struct StepTimeModel {
  double fixed_us = 0;
  double per_example_us = 0;
  double at(double examples) const { return fixed_us + per_example_us * examples; }
};

// The smallest per-example cost a fit may give a rank, as a share of its measured time per
// example t / n: a constant. Two noisy windows can make a rank look almost free (the slope of
// its time in n near 0); the floor keeps such a fit from promising an unbounded gain. It is well
// below the share of the straggler (~6 ms of compute beside a 150 ms delay: 4%).
inline constexpr double kMinSlopeShare = 0.01;

// The model of one rank from its latest window (n examples, t µs) and an earlier window
// (earlier_n, earlier_t) of the same rank:
//   - when earlier_n == n (one size measured: nothing to fit), or earlier_n < 1 (none), the
//     proportional model {0, t / n} — the n/t rule: time taken as all per-example work;
//   - otherwise the line through both points, c = (t − earlier_t) / (n − earlier_n), clamped to
//     c ≥ kMinSlopeShare · t / n, with a = t − c · n; when that a is negative (time grew faster
//     than in proportion, which a fixed cost cannot explain) the proportional model instead.
// Whatever the case the model passes through the latest point: at(n) == t (up to rounding).
// Times of 0 µs count as 1 µs (a clock too coarse for the slice). n must be >= 1.
StepTimeModel fit_step_time(int64_t n, int64_t t_us, int64_t earlier_n, int64_t earlier_t_us);

// What the balancer keeps from one rebalance to the next: per rank one earlier window, its slice
// size and mean compute µs — the latest window measured at a size other than the rank's current
// one when there was such a window, else the latest window. Both vectors empty before the first
// rebalance. Plain integers: the caller keeps it (DataParallelSteps does, through the planner
// train/engines.cpp gives it) and every rank keeps the same one, because every rank computes it
// from the same all-reduced integers.
struct BalanceHistory {
  std::vector<int64_t> sizes;
  std::vector<int64_t> compute_us;
  bool empty() const { return sizes.empty(); }
};

// The balancer's decision for one rebalance.
struct Rebalance {
  std::vector<int64_t> sizes;        // the new slice sizes (== the old ones when !changed)
  bool changed = false;              // sizes differ from the input's
  double predicted_gain = 0;         // (T − T') / T under `model` (see below)
  std::vector<StepTimeModel> model;  // per rank, the fitted model the plan used
  BalanceHistory history;            // to pass to the next rebalance
};

// The fraction of the step time a rebalance must be predicted to save to be made (§5.3): a
// constant, not a key. It keeps equal slices when speeds agree within measurement noise, and
// with it balanced runs on equal workers bit-identical to unbalanced ones.
inline constexpr double kMinGain = 0.05;

// One rebalance of slice sizes `sizes` (n_r ≥ 1, B = Σ n_r) from `compute_us`, each rank's mean
// compute time per step in microseconds over the last window (forward + backward of its slice,
// including an artificial delay; excluding communication), `max_change`
// (parallel.balance_max_change, a fraction of B / W) and `history` (what the previous rebalance
// returned; empty at the first):
//   - each rank's time is modelled as t_r(n) = a_r + c_r · n by fit_step_time from its latest
//     window and its history window: with two sizes measured the fixed cost is separated from
//     the per-example cost, so a rank with a fixed delay is moved straight to where the step
//     times meet (the n/t rule alone reads a delay as slow computing, undershoots and needs a
//     move per fraction of the way); with one size, the n/t rule (a_r = 0);
//   - each size stays within [max(1, n_r − m), n_r + m], m = floor(max_change · B / W);
//   - the new sizes minimise the predicted step time max_r t_r(n'_r) over the integer splits of B
//     within those bounds: the real-valued level T at which Σ clamp((T − a_r) / c_r, lo_r, hi_r)
//     = B gives quotas; each quota is floored and the examples left over go one at a time to the
//     rank whose predicted time after taking it is least (ties: the lower rank) — the integer
//     optimum, where rounding by largest fraction could round up a rank whose examples cost more;
//   - the predicted gain is (T − T') / T with T = max_r t_r (the measured step time; every model
//     passes through its latest point) and T' = max_r t_r(n'_r); when it is below kMinGain, or
//     no size moves, `sizes` is returned unchanged (changed = false).
// The returned history holds, per rank, the window just measured when the rank's size changes
// (or when its history window had the same size), else the history window it was given — so a
// rank whose size settles keeps the two sizes its model was fitted from.
// Deterministic: the same inputs give the same outputs bit for bit. Throws InvalidArgument when
// the lengths differ (a non-empty history included: a new world starts with an empty one),
// `sizes` or a history size is below 1, a time is negative, max_change is negative or not
// finite, or B exceeds 2^53.
Rebalance rebalance(const std::vector<int64_t>& sizes, const std::vector<int64_t>& compute_us,
                    double max_change, const BalanceHistory& history = {});

}  // namespace krab::elastic
