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
// The balancer (§5.3): see rebalance() below.
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

// The balancer's decision for one rebalance.
struct Rebalance {
  std::vector<int64_t> sizes;  // the new slice sizes (== the old ones when !changed)
  bool changed = false;        // sizes differ from the input's
  double predicted_gain = 0;   // (T − T') / T, T' predicted for the new sizes (see below)
};

// The fraction of the step time a rebalance must be predicted to save to be made (§5.3): a
// constant, not a key. It keeps equal slices when speeds agree within measurement noise, and
// with it balanced runs on equal workers bit-identical to unbalanced ones.
inline constexpr double kMinGain = 0.05;

// One rebalance of slice sizes `sizes` (n_r ≥ 1, B = Σ n_r) from `compute_us`, each rank's mean
// compute time per step in microseconds over the last window (forward + backward of its slice,
// including an artificial delay; excluding communication), and `max_change`
// (parallel.balance_max_change, a fraction of B / W):
//   - speed s_r = n_r / t_r (a time of 0 µs counts as 1 µs); target n*_r = B · s_r / Σ s —
//     the split that would equalise the step times if time were proportional to examples. With
//     a fixed per-step delay on some rank the estimate is off, but its fixed point is still
//     equal step times, so repeated rebalances converge to them;
//   - each size moves toward its target by at most m = floor(max_change · B / W) examples and
//     stays ≥ 1: the real-valued split is clamp(λ · s_r, max(1, n_r − m), n_r + m) with λ
//     chosen so that it sums to B (such a λ exists: the old sizes are inside their bounds), then
//     rounded by largest_remainder (the bounds are integers, so rounding keeps them);
//   - the step time is predicted as T = max_r t_r now and T' = max_r t_r · n'_r / n_r after; when
//     the predicted gain (T − T') / T is below kMinGain, or no size moves, `sizes` is returned
//     unchanged (changed = false).
// Deterministic: the same inputs give the same outputs bit for bit. Throws InvalidArgument when
// the lengths differ, `sizes` is empty, a size is below 1, a time is negative, max_change is
// negative or not finite, or B exceeds 2^53.
Rebalance rebalance(const std::vector<int64_t>& sizes, const std::vector<int64_t>& compute_us,
                    double max_change);

}  // namespace krab::elastic
