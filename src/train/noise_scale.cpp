#include "train/noise_scale.h"

#include "core/errors.h"

namespace krab::train {

void NoiseScale::add(double small_sq, int64_t small_batch, double big_sq, int64_t big_batch) {
  KRAB_CHECK_ARG(small_batch > 0 && big_batch > small_batch,
                 "NoiseScale: the averaged gradient's batch (", big_batch,
                 ") must exceed each rank's (", small_batch, ")");
  const double bs = static_cast<double>(small_batch), bb = static_cast<double>(big_batch);
  const double g_sq = (bb * big_sq - bs * small_sq) / (bb - bs);
  const double trace = (small_sq - big_sq) / (1 / bs - 1 / bb);
  g_sq_ = smoothing_ * g_sq_ + (1 - smoothing_) * g_sq;
  trace_ = smoothing_ * trace_ + (1 - smoothing_) * trace;
  weight_ = smoothing_ * weight_ + (1 - smoothing_);
  ++steps_;
}

std::optional<double> NoiseScale::b_simple() const {
  // The bias corrections of the two averages are equal and cancel in the ratio.
  if (steps_ == 0 || g_sq_ <= 0 || trace_ <= 0) return std::nullopt;
  return trace_ / g_sq_;
}

}  // namespace krab::train
