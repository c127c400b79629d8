#include "train/op_profile.h"

#include <torch/csrc/autograd/profiler_legacy.h>

#include <chrono>
#include <cstdlib>
#include <unordered_map>

#include "core/errors.h"

namespace krab::train {

namespace {

namespace prof = torch::autograd::profiler;
using std::chrono::nanoseconds;
using Steady = std::chrono::steady_clock;

void start_recording() {
  prof::enableProfilerLegacy(
      torch::profiler::impl::ProfilerConfig(torch::profiler::impl::ProfilerState::CPU));
}

// Maps the profiler's nanosecond stamps onto the steady clock. They are CLOCK_REALTIME in
// LibTorch 1.13 on Linux; a build stamping with the monotonic clock (which is the steady
// clock's) is recognised by being nowhere near the unix time now, and taken as it is.
class StampClock {
 public:
  StampClock()
      : steady_now_(Steady::now()),
        unix_now_(std::chrono::duration_cast<nanoseconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count()) {}
  Steady::time_point steady(int64_t stamp_ns) const {
    constexpr int64_t kDay = 86400LL * 1000000000LL;
    if (std::llabs(unix_now_ - stamp_ns) > kDay) return Steady::time_point(nanoseconds(stamp_ns));
    return steady_now_ - nanoseconds(unix_now_ - stamp_ns);
  }

 private:
  Steady::time_point steady_now_;
  int64_t unix_now_;
};

}  // namespace

OpProfile::OpProfile() { start_recording(); }

OpProfile::~OpProfile() {
  try {
    prof::disableProfilerLegacy();
  } catch (...) {  // a destructor does not throw; nothing was waiting for these events
  }
}

int64_t OpProfile::drain(const core::Events& events) {
  // The legacy profiler hands its events over only when stopped: stop, restart at once, and
  // draw what the lists hold. The gap is the restart's few microseconds between two steps.
  const prof::thread_event_lists lists = prof::disableProfilerLegacy();
  start_recording();
  const StampClock clock;
  int64_t emitted = 0;
  for (const std::vector<prof::LegacyEvent>& list : lists) {
    // An operator is a push and the pop with its handle, later in its thread's list; a push
    // without its pop (an operator still running when the lists were taken) is left out.
    std::unordered_map<uint64_t, const prof::LegacyEvent*> open;
    for (const prof::LegacyEvent& e : list) {
      if (e.kind() == prof::EventKind::PushRange) {
        open[e.handle()] = &e;
        continue;
      }
      if (e.kind() != prof::EventKind::PopRange) continue;
      const auto push = open.find(e.handle());
      if (push == open.end()) continue;
      const prof::LegacyEvent& begin = *push->second;
      const auto start = clock.steady(static_cast<int64_t>(begin.cpuUs() * 1000.0));
      events.span(str_cat("op.", begin.name()), start, begin.cpuElapsedUs(e) / 1e6);
      open.erase(push);
      ++emitted;
    }
  }
  return emitted;
}

}  // namespace krab::train
