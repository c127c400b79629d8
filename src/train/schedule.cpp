#include "train/schedule.h"

#include <algorithm>
#include <cmath>

#include "core/errors.h"

namespace krab::train {

Schedule parse_schedule(const std::string& name) {
  if (name == "constant") return Schedule::kConstant;
  if (name == "cosine") return Schedule::kCosine;
  if (name == "linear") return Schedule::kLinear;
  throw InvalidArgument(str_cat("train.lr_schedule: unknown schedule '", name,
                                "' (known: constant, cosine, linear)"));
}

double learning_rate(Schedule schedule, double base_lr, int64_t step, int64_t total_steps,
                     int64_t warmup_steps) {
  if (warmup_steps > 0 && step < warmup_steps)
    return base_lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  if (schedule == Schedule::kConstant) return base_lr;
  const double span = static_cast<double>(std::max<int64_t>(1, total_steps - warmup_steps));
  const double t = std::clamp(static_cast<double>(step - warmup_steps) / span, 0.0, 1.0);
  if (schedule == Schedule::kCosine) return base_lr * 0.5 * (1.0 + std::cos(M_PI * t));
  return base_lr * (1.0 - t);
}

}  // namespace krab::train
