// monitor.profile_ops: LibTorch's own operator profiler (its "legacy" CPU profiler, the one
// Debian's LibTorch 1.13 has without Kineto's GPU half), feeding --trace's timeline.
//
// While an OpProfile lives, LibTorch records every operator the training thread runs (and the
// autograd threads it hands work to): its name, its start and its end. drain() turns what was
// recorded since the last call into spans named "op.<operator>" ("op.aten::addmm"), emitted
// through the loop's Events, which the trace sink draws on a track of their own under the
// rank's step phases (monitor/trace_sink.h); the other sinks ignore names they do not know.
// The loop drains after every step, so what is held is one step's operators, not the run's.
//
// Times: the profiler stamps events with CLOCK_REALTIME (torch/csrc/profiler/util.h, getTime);
// drain() maps them onto the steady clock the other spans use with one reading of both
// clocks, so an operator lands inside the phase that ran it.
//
// Cost: LibTorch's profiler adds microseconds per operator (a small CNN's step runs a few
// hundred), and each drain stops and restarts it; it is for looking, not for benchmarks.
// Thread: construct, drain and destroy on the training thread (the profiler's state is
// thread-local).
#pragma once

#include <cstdint>

#include "core/events.h"

namespace krab::train {

class OpProfile {
 public:
  // Starts recording. Throws what LibTorch throws if a profiler is already running here.
  OpProfile();
  // Stops recording and drops what was not drained.
  ~OpProfile();
  OpProfile(const OpProfile&) = delete;
  OpProfile& operator=(const OpProfile&) = delete;

  // Emits the operators recorded since the last drain as spans, and records on. Returns how
  // many it emitted.
  int64_t drain(const core::Events& events);
};

}  // namespace krab::train
