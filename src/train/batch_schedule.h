// How the loop's optimizer steps map onto the sampler's global micro-batches, and what the
// run's length, the learning-rate schedule, train.eval_every and checkpoint.every_steps count.
//
// The sampler (data/sampler.h) numbers global micro-batches 0, 1, 2, ... as a pure function of
// the seed; a step takes the next few of them. With a fixed batch every step takes
// train.grad_accum of them, and every count above is in steps, as it always was. With
// train.adaptive_batch (train/adaptive_batch.h) the number changes during the run: the schedule
// is then a list of segments, each "from step s on, k micro-batches a step", appended only for
// steps not yet run, so where any step starts is known exactly (and, recorded in checkpoints,
// after a resume). Lengths then count *units*, steps of the smallest batch (`unit`
// micro-batches): train.steps, train.warmup_steps, the schedule, train.eval_every and
// checkpoint.every_steps mean the same number of examples whatever batch the run chose.
//
// A fixed batch is the one-segment case with unit = train.grad_accum: every function below then
// gives what the step-counting loop computed before (units are steps).
#pragma once

#include <cstdint>
#include <vector>

namespace krab::train {

struct BatchSegment {
  int64_t first_step = 0;     // the segment's first optimizer step
  int64_t first_micro = 0;    // the global micro-batch that step starts at
  int64_t micro_batches = 1;  // per step
  double noise_scale = 0;     // B_simple when it was chosen (0: none; the gain is then 1)
};

class BatchSchedule {
 public:
  // `unit`: micro-batches of the smallest batch; `total_micro`: the micro-batches the run
  // trains on (its last step takes what is left when fewer than its segment's count).
  BatchSchedule(int64_t unit, int64_t total_micro);

  int64_t unit() const { return unit_; }
  int64_t total_micro() const { return total_micro_; }
  // The run's length in units (the progress bar's total; what train.steps asked for).
  int64_t total_units() const { return total_micro_ / unit_; }

  // Step `step` (>= 0): its first global micro-batch and how many it takes (the last step's
  // cut at total_micro). A step past the end (past_end: a parameter server hands out a dead
  // worker's share as steps beyond the run's) takes its segment's count, as every step did.
  int64_t first_micro(int64_t step) const;
  int64_t micro_batches(int64_t step) const;
  bool past_end(int64_t step) const { return first_micro(step) >= total_micro_; }
  int64_t micro_after(int64_t step) const { return first_micro(step) + micro_batches(step); }
  // Whole units done before `step` starts: what the learning-rate schedule reads.
  int64_t units_before(int64_t step) const { return first_micro(step) / unit_; }
  int64_t units_after(int64_t step) const { return micro_after(step) / unit_; }
  // True for the run's last step.
  bool last(int64_t step) const { return micro_after(step) >= total_micro_; }
  // True when `step` crosses a multiple of `every` units (every > 0): evaluation, checkpoints.
  bool crosses(int64_t step, int64_t every) const;
  // The segment `step` falls in.
  const BatchSegment& segment(int64_t step) const;

  // From `segment.first_step` on (later than every segment's first step so far, and not
  // before the steps already run), the segment's count. Its first_micro is derived here.
  void append(BatchSegment segment);
  const std::vector<BatchSegment>& segments() const { return segments_; }
  // Replaces the segments (a checkpoint's); InvalidArgument when they are not a schedule:
  // the first at step 0 and micro-batch 0, steps increasing, counts >= 1, each first_micro
  // where the segment before ends.
  void restore(std::vector<BatchSegment> segments);

 private:
  int64_t unit_;
  int64_t total_micro_;
  std::vector<BatchSegment> segments_;
};

}  // namespace krab::train
