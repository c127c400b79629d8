// The gradient noise scale (McCandlish, Kaplan, Amodei et al. 2018, "An Empirical Model of
// Large-Batch Training", appendix A.1), from what data parallelism already has: each rank's
// gradient of its own slice (batch b) and their average (batch W·b). For an unbiased gradient
// estimate of batch B, E|g_B|² = |G|² + tr(Σ)/B, so two batch sizes give both unknowns:
//
//   |G|²  ≈ (B_big |g_big|² − B_small |g_small|²) / (B_big − B_small)
//   tr(Σ) ≈ (|g_small|² − |g_big|²) / (1/B_small − 1/B_big)
//
// with |g_small|² the mean over ranks of each rank's squared norm. Both estimates are noisy
// (one step's |G|² can even come out negative), so, as the paper does, each is smoothed over
// steps (an exponential moving average) before the ratio B_simple = tr(Σ) / |G|² is taken:
// the batch size beyond which a larger batch stops paying for itself in steps. What adaptive
// batch sizing (train.adaptive_batch, Pollux) follows as training goes.
#pragma once

#include <cstdint>
#include <optional>

namespace krab::train {

class NoiseScale {
 public:
  // `smoothing`: the weight of the past in each moving average, in [0, 1).
  explicit NoiseScale(double smoothing = 0.95) : smoothing_(smoothing) {}
  // One step: `small_sq` the mean over ranks of |g|² of each rank's gradient of `small_batch`
  // examples; `big_sq` |g|² of their average, the gradient of `big_batch` examples.
  void add(double small_sq, int64_t small_batch, double big_sq, int64_t big_batch);
  // B_simple from the averages so far; none until both are positive (early steps, or a
  // gradient so large against its noise that |G|² dominates and tr(Σ) comes out <= 0).
  std::optional<double> b_simple() const;
  // The smoothed estimates (bias-corrected, as Adam's moments: the averages start at 0).
  double gradient_sq() const { return weight_ > 0 ? g_sq_ / weight_ : 0; }
  double trace_sigma() const { return weight_ > 0 ? trace_ / weight_ : 0; }
  int64_t steps() const { return steps_; }

  // The raw averages, for a checkpoint (train/adaptive_batch.h) to continue them exactly.
  struct State {
    double g_sq = 0, trace = 0, weight = 0;
    int64_t steps = 0;
  };
  State state() const { return {g_sq_, trace_, weight_, steps_}; }
  void set_state(const State& s) {
    g_sq_ = s.g_sq;
    trace_ = s.trace;
    weight_ = s.weight;
    steps_ = s.steps;
  }

 private:
  double smoothing_;
  double g_sq_ = 0, trace_ = 0;
  double weight_ = 0;  // bias correction of the averages (as Adam's): 1 − smoothing^steps
  int64_t steps_ = 0;
};

}  // namespace krab::train
