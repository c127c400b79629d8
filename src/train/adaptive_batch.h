// train.adaptive_batch: the global batch follows the gradient noise scale while training.
//
// Why a batch should change: a step of batch B makes about as much progress as
// r(B) = (B_noise/B0 + 1) / (B_noise/B + 1) steps of the smallest batch B0 (AdaScale's gain,
// Johnson et al. 2020, written with the noise scale B_noise = tr(Σ)/|G|² of McCandlish et al.
// 2018: r grows like B/B0 while B is far below B_noise and stops growing beyond it). A step
// costs t(B) = a + c·B seconds: `a` what a step pays whatever its batch (the exposed all-reduce,
// the optimizer, the loop), `c` the compute of one example. Progress per second, r(B)/t(B) (the
// goodput of Pollux, Qiao et al. OSDI 2021), is largest near B* = sqrt(B_noise · a/c): small
// batches while the gradient is clean (early training) or steps are cheap, larger ones as the
// noise grows or communication dominates. The learning rate follows the batch by the same gain
// (AdaScale, for SGD), or its square root for Adam and AdamW (the square-root scaling rule of
// adaptive methods, Malladi et al. 2022).
//
// How krab runs it: a step of k global micro-batches (train/batch_schedule.h), k between the
// bounds' counts, is one forward and backward of this rank's part of all k (k x
// data.batch_size examples per worker; the launcher refuses a max whose per-worker batch the
// memory cannot hold) and one reduction. B_noise comes from the per-worker
// and averaged gradients data parallelism already has (train/noise_scale.h); `a` and `c` from
// each step's measured compute and step time, or from train.adaptive_batch.overhead_examples
// (a/c fixed, which makes the choices a pure function of the gradients: reproducible, and
// what the tests use). Measured, the compute of a step is fitted as α + β·B over the counts
// run so far (a forward of more examples costs less per example on most hardware: α joins
// `a`); while only one count was run, the first decision tries the next larger one for a
// window, so that the line has two points. Every `kDecideEvery` steps the ranks average their
// estimates in one all-reduce of five numbers and all take the same decision for the steps to come;
// the decisions are the schedule's segments, in the report and in every checkpoint, so a resumed
// run continues the same sequence of batches and rates.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/config.h"
#include "train/batch_schedule.h"
#include "train/noise_scale.h"

namespace krab::comm {
class Communicator;
}

namespace krab::train {

struct AdaptiveBatchOptions {
  int64_t micro = 0;             // examples of a global micro-batch: data.batch_size x workers
  int64_t min_micro = 1;         // micro-batches of the smallest batch (train.adaptive_batch.min)
  int64_t max_micro = 1;         // of the largest (train.adaptive_batch.max)
  double overhead_examples = 0;  // a/c fixed; 0: measured
  bool sqrt_gain = false;        // adam, adamw: the learning rate scales by the gain's root

  // None when train.adaptive_batch.max is 0. InvalidArgument naming the key for bounds that
  // are not multiples of the global micro-batch (data.batch_size x `workers`), min above
  // max, a max larger than the `train_examples` of the data (a step would see an example
  // twice), and for what cannot carry it (check_adaptive_batch_options).
  static std::optional<AdaptiveBatchOptions> from_config(const core::Config& c, int workers,
                                                         int64_t train_examples);
};

// The cross-key refusals (InvalidArgument naming both keys): fewer than 2 workers (the noise
// scale needs each worker's gradient and their average), sync.mode other than sync,
// parallel.zero_stage > 0, a lossy comm.compression (the averaged gradient's norm would be the
// codec's), elastic.enabled (a joiner would need the schedule; not built) and train.grad_accum
// above 1 (the batch is accumulated by the schedule itself). Nothing when the key is 0. The
// launcher runs it before spawning anything; the workers again.
void check_adaptive_batch_options(const core::Config& c, int workers);

// AdaScale's gain of a batch of `batch` examples against `min_batch` at noise scale
// `noise_scale` (1 at the smallest batch; 1 when the noise scale is unknown, 0).
double adascale_gain(double noise_scale, int64_t min_batch, int64_t batch);

// The count of micro-batches in [min_micro, max_micro] with the most progress per second at
// noise scale `noise_scale` and overhead a/c = `overhead_examples`, or `current` unless the
// best beats it by more than 2% (so that noise in the estimates does not toggle the batch).
int64_t choose_micro_batches(const AdaptiveBatchOptions& o, double noise_scale,
                             double overhead_examples, int64_t current);

// a/c in examples from timings: the mean compute seconds of a step of k micro-batches
// (compute_sums[k] / steps[k], k >= 1, counts never run have 0 steps) fitted as α + β·k·micro,
// and `outside` the mean seconds a step spends outside its compute: (outside + α) / β. With one
// count run, α = 0 (a line through the origin), as also when the fit gives α < 0 or β <= 0.
// None when nothing was timed.
std::optional<double> fitted_overhead(int64_t micro, const std::vector<double>& compute_sums,
                                      const std::vector<double>& steps, double outside);

class AdaptiveBatch {
 public:
  static constexpr int64_t kDecideEvery = 25;  // steps between decisions
  static constexpr int64_t kSettleSteps = 3;   // steps after the start not timed (warm caches)

  AdaptiveBatch(AdaptiveBatchOptions o, BatchSchedule& schedule) : o_(o), schedule_(schedule) {}

  // The learning rate's multiplier at `step` (the gain of its count, or its root).
  double lr_gain(int64_t step) const;
  // A step this rank computed: the gradient norms (NoiseScale::add's arguments) and, after
  // kSettleSteps steps from `first_step`, its seconds of compute and of the whole step.
  void observe_gradients(double small_sq, int64_t small_batch, double big_sq, int64_t big_batch);
  void observe_time(int64_t step, int64_t first_step, double compute_s, double step_s,
                    int64_t micro_batches);
  // After `step`'s update, on every rank: at every kDecideEvery-th step, the ranks agree on
  // the estimates (collective) and the schedule gains a segment from step + 1 when the choice
  // changes. The decision is also kept for the report.
  void maybe_decide(int64_t step, comm::Communicator& group);

  // The state a checkpoint keeps (the schedule's segments and the smoothed noise estimates),
  // as numbers; restore() checks them (CorruptData naming `source`).
  std::vector<double> save() const;
  void restore(const std::vector<double>& state, const std::string& source);
  // The report's `adaptive_batch`.
  nlohmann::json describe() const;

 private:
  AdaptiveBatchOptions o_;
  BatchSchedule& schedule_;
  // The overhead a/c in examples from the ranks' averaged timings: `a` the mean time a step
  // spent outside its forward and backward plus the fixed part of a forward, `c` the time per
  // example, fitted over the counts measured (time = α + β · examples per step); none before
  // anything was timed.
  std::optional<double> measured_overhead(const std::vector<double>& averaged) const;

  NoiseScale noise_;
  double window_overhead_ = 0;  // seconds outside compute, summed over the window's timed steps
  int64_t window_steps_ = 0;
  // Per count k of micro-batches (index k): compute seconds summed, and steps, over the run.
  std::vector<double> compute_sum_, compute_steps_;
  bool explored_ = false;  // one window was spent on a larger count to fit the line
  nlohmann::json decisions_ = nlohmann::json::array();
};

}  // namespace krab::train
