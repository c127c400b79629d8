// The steps of every data-parallel engine (DataParallelEngine, ZeRO's): handed out in order
// from the resume point until total_steps, each with this rank's slice of every global
// micro-batch. Equal slices (data::equal_slice), or, with a balancer (parallel.balance: auto),
// slices sized by how fast each rank computes: every `every` steps the ranks all-reduce their
// mean compute time over the window (one int64 per rank) and every rank runs the same pure
// plan on the same integers, so all agree on the new sizes without a leader. The plan's
// weight (engine.h, StepPlan::weight) makes every slice size give the global batch's mean
// gradient.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>
#include <vector>

#include "engine/engine.h"

namespace krab::comm {
class Communicator;
}

namespace krab::parallel {

// What a planner carries from one rebalance to the next (per rank an earlier window: its slice
// size and mean compute microseconds), opaque to the steps: empty at first, handed to every
// plan and replaced by what the plan returns. Kept here rather than inside the planner so that
// the planner stays a pure function of its arguments.
struct SliceMemory {
  std::vector<int64_t> sizes;
  std::vector<int64_t> compute_us;
};

struct SlicePlan {
  std::vector<int64_t> sizes;  // the new sizes: same sum, each >= 1
  SliceMemory memory;          // for the next plan
};

// The balancer's policy, injected (train/engines.cpp passes elastic/slices.h's planner):
// given the current slice sizes (one per rank, summing to the global micro-batch), each rank's
// mean compute microseconds per step over the last window and the memory the previous plan
// returned, the new sizes and memory. Must be a pure function of its arguments: every rank
// calls it on the same values and must get the same answer.
using SlicePlanner =
    std::function<SlicePlan(const std::vector<int64_t>& sizes,
                            const std::vector<int64_t>& compute_us, const SliceMemory& memory)>;

struct SliceBalance {
  int64_t every = 0;  // steps between rebalances; 0: equal slices for the whole run
  SlicePlanner plan;
};

class DataParallelSteps {
 public:
  DataParallelSteps(int64_t total_steps, int64_t global_micro_batch, SliceBalance balance = {})
      : total_(total_steps),
        global_micro_batch_(global_micro_batch),
        balance_(std::move(balance)) {}
  void start_at(int64_t step);
  // The next step, or nullopt at the end. Collective (an all-reduce on `group`) at a rebalance:
  // every rank calls it once per step, as the engines do.
  std::optional<engine::StepPlan> next(comm::Communicator& group);
  // This rank's forward+backward seconds of the step just handed out (Engine::after_compute).
  void after_compute(double seconds);
  // {"every", "changes": [[step, n_0, ..., n_W-1], ...]} with a balancer; null without one.
  nlohmann::json describe() const;

 private:
  void rebalance(comm::Communicator& group);

  int64_t total_ = 0;
  int64_t global_micro_batch_ = 0;
  int64_t next_ = 0;
  SliceBalance balance_;
  std::vector<int64_t> sizes_;  // per rank; empty until the first next() (needs the world)
  SliceMemory memory_;          // the planner's, between rebalances
  int64_t window_us_ = 0;       // compute time summed over the window's steps
  int64_t window_steps_ = 0;
  std::vector<std::pair<int64_t, std::vector<int64_t>>> changes_;  // (first step, sizes)
};

}  // namespace krab::parallel
