#include "train/batch_schedule.h"

#include <algorithm>

#include "core/errors.h"

namespace krab::train {

BatchSchedule::BatchSchedule(int64_t unit, int64_t total_micro)
    : unit_(unit), total_micro_(total_micro) {
  KRAB_CHECK_ARG(unit >= 1 && total_micro >= 0, "BatchSchedule: unit ", unit, ", total ",
                 total_micro);
  segments_.push_back({0, 0, unit, 0});
}

const BatchSegment& BatchSchedule::segment(int64_t step) const {
  KRAB_CHECK_ARG(step >= 0, "BatchSchedule: step ", step);
  // The last segment whose first step is <= step; segments are few (a change every few dozen
  // steps at most), so a scan from the end finds it at once for the steps the loop runs.
  for (auto it = segments_.rbegin(); it != segments_.rend(); ++it)
    if (it->first_step <= step) return *it;
  return segments_.front();
}

int64_t BatchSchedule::first_micro(int64_t step) const {
  const BatchSegment& s = segment(step);
  return s.first_micro + (step - s.first_step) * s.micro_batches;
}

int64_t BatchSchedule::micro_batches(int64_t step) const {
  const int64_t first = first_micro(step);
  const int64_t count = segment(step).micro_batches;
  return first < total_micro_ ? std::min(count, total_micro_ - first) : count;
}

bool BatchSchedule::crosses(int64_t step, int64_t every) const {
  const int64_t span = every * unit_;
  return micro_after(step) / span > first_micro(step) / span;
}

void BatchSchedule::append(BatchSegment next) {
  const BatchSegment& back = segments_.back();
  KRAB_CHECK_ARG(next.first_step > back.first_step && next.micro_batches >= 1,
                 "BatchSchedule: segment at step ", next.first_step, " after one at step ",
                 back.first_step);
  next.first_micro = back.first_micro + (next.first_step - back.first_step) * back.micro_batches;
  segments_.push_back(next);
}

void BatchSchedule::restore(std::vector<BatchSegment> segments) {
  KRAB_CHECK_ARG(!segments.empty() && segments[0].first_step == 0 && segments[0].first_micro == 0,
                 "the batch schedule does not start at step 0");
  for (size_t k = 0; k < segments.size(); ++k) {
    const BatchSegment& s = segments[k];
    KRAB_CHECK_ARG(s.micro_batches >= 1 && s.noise_scale >= 0, "batch schedule segment ", k,
                   " has ", s.micro_batches, " micro-batches and noise scale ", s.noise_scale);
    if (k == 0) continue;
    const BatchSegment& p = segments[k - 1];
    KRAB_CHECK_ARG(
        s.first_step > p.first_step &&
            s.first_micro == p.first_micro + (s.first_step - p.first_step) * p.micro_batches,
        "batch schedule segment ", k, " (step ", s.first_step, ", micro-batch ", s.first_micro,
        ") does not follow the one before");
  }
  segments_ = std::move(segments);
}

}  // namespace krab::train
