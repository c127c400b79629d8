// The autoscale policy (docs/design/elastic.md §8): whether to add a worker, remove one or hold,
// from how fast the run goes at each size. Pure: the keeper's adapter feeds it rank 0's progress
// records — (step, Unix time) per completed step, read from `elastic/progress` — with the world
// size that computed them and the capacity the provider reports; it answers with a decision or
// nothing. No clock, no processes, no store: a test drives it with a fake step clock.
//
// What it measures. For each stint at one size W (from the first progress record at W), the first
// kAutoscaleWarmupSteps steps are skipped (a joiner's state transfer, caches, the balancer), then
// the wall time of each of `window_steps` steps is taken from consecutive records (a record that
// skips steps gives each of them the mean), and
//
//   rate_W = examples_per_step / median(step wall time)      (examples per second)
//
// with examples_per_step = B × micro_batches: the global batch is fixed (§5.1), so rates at
// different sizes compare the same work. The median ignores an odd slow step (a checkpoint, a
// rebalance). The measurement repeats, window after window, for as long as the size stays; the
// latest measurement of each size is its rate.
//
// What it decides, when the current size has been measured in this stint and no decision is
// awaiting its world change. The efficiency of the last addition W−1 → W is
//
//   e_W = (rate_W − rate_{W−1}) / (rate_{W−1} / (W−1))
//
// the new worker's marginal throughput relative to the average worker's before it (1 for linear
// scaling, 0 when the addition gained nothing, negative when it lost), defined when W−1 has been
// measured too (by the latest measurements of both). Then, in this order:
//   - **remove** (W → W−1) when e_W < down_efficiency and W − 1 ≥ min_workers. Size W is marked
//     bad with the reference rate_{W−1} of the decision, and no decision follows for
//     cooldown_steps;
//   - **add** (W → W+1) when W < max_workers, the provider has capacity ≥ 1, e_W ≥
//     up_efficiency or e_W is undefined (W−1 never measured: the start, or after a death), and
//     W+1 is not bad — a bad size may be re-added only once the current rate_W differs from its
//     reference by more than kRateMovedShare (20%): something changed since it was judged; and
//     at most kBadSizeRetries times: found bad once more, it stays out for the rest of the run;
//   - otherwise **hold**. Between the two thresholds nothing moves (the hysteresis band).
// A decision is pending until a record arrives with another size (the proposal took effect, or a
// death intervened) or the adapter calls proposal_failed(); while pending, nothing is decided and
// nothing is measured (a joiner starting up shares the machine: those steps would lower the
// rate the next size is compared with).
// Changes are proposals (§2.4), one worker at a time.
//
// "Settled": nothing pending, the current size measured in this stint, and no decision for
// 2 × window_steps steps (since the first record when none was ever made).
//
// Every decision is re-derivable from what the policy exposes: measurements() lists every
// completed window (size, step, median, rate) and each ScaleDecision carries the rates and the
// efficiency it used; the report prints both (`autoscale.sizes`, `autoscale.decisions`).
//
// Not thread-safe: one owner (the keeper's adapter thread) calls it.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace krab::elastic {

// Steps skipped at the start of each stint at one size.
inline constexpr int64_t kAutoscaleWarmupSteps = 5;
// How far (as a share of the reference) the current rate must move before a size found bad may
// be tried again.
inline constexpr double kRateMovedShare = 0.2;
// How many times a size found bad may be tried again (each time after the rate moved): a size
// found bad kBadSizeRetries + 1 times is never added again in the run. Without a limit, noise
// above kRateMovedShare (a loaded machine) re-adds a bad size after every cooldown.
inline constexpr int kBadSizeRetries = 1;

// The policy's knobs: the elastic.autoscale.* keys of §7 (plus the elastic.* bounds and the
// batch it needs), filled in by the caller from the job's config.
struct AutoscaleOptions {
  double up_efficiency = 0.6;     // elastic.autoscale.up_efficiency
  double down_efficiency = 0.3;   // elastic.autoscale.down_efficiency
  int64_t window_steps = 20;      // elastic.autoscale.window_steps
  int64_t cooldown_steps = 60;    // elastic.autoscale.cooldown_steps
  int min_workers = 1;            // elastic.min_workers
  int max_workers = 1;            // elastic.max_workers, resolved (0 in the config means
                                  // parallel.workers)
  int64_t examples_per_step = 1;  // B × micro_batches (train.batch × parallel.workers × ...)

  // Throws InvalidArgument naming the key: a threshold not finite, down_efficiency >
  // up_efficiency, window_steps < 1, cooldown_steps < 0, min_workers < 1, max_workers <
  // min_workers, examples_per_step < 1.
  void validate() const;
};

// One completed measurement window.
struct SizeRate {
  int workers = 0;
  int64_t step = 0;          // the step that completed the window
  double median_step_s = 0;  // the median wall time of its window_steps steps
  double rate = 0;           // examples_per_step / median_step_s, examples per second
};

enum class ScaleAction { kAdd, kRemove };
const char* to_string(ScaleAction action);  // "add", "remove"

struct ScaleDecision {
  ScaleAction action = ScaleAction::kAdd;
  int64_t step = 0;                  // the step of the record that decided it
  int from = 0;                      // the size then
  int to = 0;                        // from ± 1
  double rate = 0;                   // rate_from, by its latest measurement
  std::optional<double> rate_below;  // rate_{from−1}, when measured
  std::optional<double> efficiency;  // e_from, when rate_below is known
  std::string reason;  // e.g. "e 0.11 < down 0.3", "e 0.90 >= up 0.6", "no addition measured"
};

class AutoscalePolicy {
 public:
  // Throws InvalidArgument when `options` does not validate().
  explicit AutoscalePolicy(AutoscaleOptions options);

  // Rank 0 completed `step` at `unix_s`, with `workers` members computing it; the provider can
  // start `capacity` more workers now. Returns the decision this record triggers, if any.
  // Records of a step not after the previous one (a retried step after a membership change) or
  // a time not after the previous one (a wall clock stepped back) measure nothing, but still
  // count toward warm-up, cooldown and settling. Throws InvalidArgument when workers < 1.
  std::optional<ScaleDecision> on_progress(int64_t step, double unix_s, int workers, int capacity);

  // The provider could not carry out the pending decision (no job started, the joiner was
  // refused): it is dropped, and like a removal it starts a cooldown from `step`.
  void proposal_failed(int64_t step);

  bool pending() const { return pending_; }
  bool settled() const;
  int workers() const { return workers_; }

  // e_W by the latest measurements of W and W−1; nullopt unless both were measured.
  std::optional<double> efficiency(int workers) const;
  // The latest measurement of a size, if any.
  std::optional<SizeRate> rate(int workers) const;
  const std::vector<SizeRate>& measurements() const { return measurements_; }
  const std::vector<ScaleDecision>& decisions() const { return decisions_; }

 private:
  void start_stint(int64_t step, double unix_s, int workers);
  void measure(int64_t step, double unix_s);
  std::optional<ScaleDecision> decide(int64_t step, int capacity);
  std::optional<ScaleDecision> record(ScaleAction action, int64_t step, std::string reason);

  AutoscaleOptions options_;
  int workers_ = 0;  // 0 before the first record
  int64_t stint_start_ = 0;
  bool stint_measured_ = false;
  int64_t last_step_ = 0;
  double last_time_ = 0;
  std::vector<double> window_;  // step seconds of the window in progress
  bool pending_ = false;
  int64_t quiet_since_ = 0;     // the last decision's step, or the first record's
  int64_t cooldown_until_ = 0;  // no decision before this step
  std::map<int, double> bad_;   // size found bad -> the reference rate of the size below it
  std::map<int, int> strikes_;  // size -> how many times it was found bad
  std::map<int, SizeRate> latest_;
  std::vector<SizeRate> measurements_;
  std::vector<ScaleDecision> decisions_;
};

}  // namespace krab::elastic
