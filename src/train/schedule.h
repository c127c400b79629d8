// Learning-rate schedules: pure functions of the step, so that a resumed run (which knows only
// its global step) sets exactly the rate the uninterrupted run would have set.
//
//   constant: lr at every step.
//   cosine:   lr * 0.5 * (1 + cos(pi * t / T)) after warm-up; 0 would be step T, one past the
//             last (as PyTorch's CosineAnnealingLR with T_max = T);
//             t counts steps after warm-up, T the steps after warm-up.
//   linear:   lr * (1 - t / T) after warm-up.
// Warm-up (warmup_steps > 0) ramps linearly from lr / warmup_steps at step 0 to lr at step
// warmup_steps - 1, for every schedule.
#pragma once

#include <cstdint>
#include <string>

namespace krab::train {

enum class Schedule { kConstant, kCosine, kLinear };

// Parses "constant" | "cosine" | "linear"; anything else throws InvalidArgument naming
// train.lr_schedule.
Schedule parse_schedule(const std::string& name);

// Learning rate for optimizer step `step` (0-based) of `total_steps`.
double learning_rate(Schedule schedule, double base_lr, int64_t step, int64_t total_steps,
                     int64_t warmup_steps);

}  // namespace krab::train
