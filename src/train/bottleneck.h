// The bottleneck report: where each rank's step time goes, which rank is the slowest, and the
// one config key that addresses the largest share of what is not computation.
//
// Every rank sums its step phases (train/step_phases.h) in a PhaseSink; at the end of the run
// the loop gathers the sums (one row per rank) and rank 0 makes the report's `bottleneck`
// section with bottleneck_report(). Per rank, the fractions of its mean step time:
//
//   compute        forward + backward (the artificial straggler's delay included)
//   communication  the communication nobody hid: the least any rank spent in the step's
//                  collectives (reduce, after, the shared loss). The slowest rank arrives last
//                  at each collective and waits for nobody, so its time in them is the
//                  communication alone.
//   waiting        its time in the collectives beyond that least: waiting for slower ranks. A
//                  rank that is slow after it launched its buckets (an artificial straggler
//                  sleeps after backward) makes the others wait at the next collective, the
//                  shared loss or the next step's reduce: both count.
//   data           waiting for the batch
//   optimizer      the update
//   other          the rest of the step: checkpoints, evaluations, the loop
//
// The slowest rank is the one with the most compute + data + optimizer per step. The largest
// share is the overhead (communication, waiting, data, optimizer) with the highest mean over
// the ranks; when all of them stay under a tenth of the step, the run is compute-bound.
#pragma once

#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/events.h"

namespace krab::train {

// Seconds in each step phase on one rank, summed over the steps since the last reset().
struct PhaseTotals {
  enum Phase {
    kData,
    kForward,
    kBackward,
    kReduce,
    kOptimizer,
    kAfter,
    kEnd,
    kLoss,
    kStep,
    kCount
  };
  std::array<double, kCount> seconds{};
  int64_t steps = 0;  // step spans seen
};

// The PhaseTotals index of a span name of train/step_phases.h, or -1 for a span that is not a
// step phase (evaluation, checkpoint, membership, comm.*).
int phase_index(const std::string& span);

// Sums the loop's step phases as they come (core/events.h).
class PhaseSink : public core::EventSink {
 public:
  void on_span(const std::string& name, std::chrono::steady_clock::time_point start,
               double seconds) override;
  // Forgets what was summed: the loop calls it when its measurement warm-up ends.
  void reset() { totals_ = {}; }
  const PhaseTotals& totals() const { return totals_; }

 private:
  PhaseTotals totals_;
};

// What the suggestion depends on, besides the times.
struct RunShape {
  int workers = 1;
  std::string compression = "none";  // comm.compression
  std::string sync_mode = "sync";    // sync.mode
  std::string balance = "off";       // parallel.balance
  int zero_stage = 0;
  bool decodes_images = false;  // data.name images (data.decode_threads applies)
  int decode_threads = 0;
};

// The report's `bottleneck` section from every rank's totals (index = rank):
//   {"ranks": [{"rank", "step_seconds", "compute", "communication", "waiting", "data",
//               "optimizer", "other"}, ...],
//    "slowest_rank", "largest" (one of the fractions' names, or "compute"),
//    "suggestion": {"key", "value", "why"}}
// Null when no rank timed a step (a run resumed at its end).
nlohmann::json bottleneck_report(const std::vector<PhaseTotals>& ranks, const RunShape& shape);

// The lines the end of a run prints of it (no "krab: " prefix): the mean shares, the slowest
// rank, the suggestion.
std::vector<std::string> describe_bottleneck(const nlohmann::json& bottleneck);

}  // namespace krab::train
