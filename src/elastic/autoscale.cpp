#include "elastic/autoscale.h"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <sstream>

#include "core/errors.h"

namespace krab::elastic {
namespace {

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t mid = values.size() / 2;
  return values.size() % 2 == 1 ? values[mid] : (values[mid - 1] + values[mid]) / 2;
}

std::string two_decimals(double value) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(2) << value;
  return out.str();
}

}  // namespace

void AutoscaleOptions::validate() const {
  KRAB_CHECK_ARG(std::isfinite(up_efficiency), "elastic.autoscale.up_efficiency ", up_efficiency,
                 " is not a number");
  KRAB_CHECK_ARG(std::isfinite(down_efficiency), "elastic.autoscale.down_efficiency ",
                 down_efficiency, " is not a number");
  KRAB_CHECK_ARG(down_efficiency <= up_efficiency, "elastic.autoscale.down_efficiency ",
                 down_efficiency, " > elastic.autoscale.up_efficiency ", up_efficiency,
                 ": a size could be added and removed on the same measurement");
  KRAB_CHECK_ARG(window_steps >= 1, "elastic.autoscale.window_steps ", window_steps,
                 " must be >= 1");
  KRAB_CHECK_ARG(cooldown_steps >= 0, "elastic.autoscale.cooldown_steps ", cooldown_steps,
                 " must be >= 0");
  KRAB_CHECK_ARG(min_workers >= 1, "elastic.min_workers ", min_workers, " must be >= 1");
  KRAB_CHECK_ARG(max_workers >= min_workers, "elastic.min_workers ", min_workers,
                 " > elastic.max_workers ", max_workers);
  KRAB_CHECK_ARG(examples_per_step >= 1, "autoscale: ", examples_per_step,
                 " examples per step (the global batch x micro-batches) must be >= 1");
}

const char* to_string(ScaleAction action) { return action == ScaleAction::kAdd ? "add" : "remove"; }

AutoscalePolicy::AutoscalePolicy(AutoscaleOptions options) : options_(options) {
  options_.validate();
}

std::optional<ScaleDecision> AutoscalePolicy::on_progress(int64_t step, double unix_s, int workers,
                                                          int capacity) {
  KRAB_CHECK_ARG(workers >= 1, "autoscale: a progress record from a world of ", workers,
                 " workers");
  if (workers_ == 0) {
    quiet_since_ = step;
    start_stint(step, unix_s, workers);
    return std::nullopt;
  }
  if (workers != workers_) {
    // The proposal took effect, or a death or a join beside the policy changed the world: either
    // way what was measured so far belongs to the old size, and nothing is pending any more.
    pending_ = false;
    start_stint(step, unix_s, workers);
    return std::nullopt;
  }
  if (pending_) {
    // The decided change is being carried out (a joiner starting shares the machine, a leaver
    // is finishing): steps now say nothing about this size and would lower the reference the
    // next size is judged against. Only the anchor moves.
    last_step_ = std::max(last_step_, step);
    last_time_ = unix_s;
    window_.clear();
    return std::nullopt;
  }
  measure(step, unix_s);
  return decide(step, capacity);
}

void AutoscalePolicy::proposal_failed(int64_t step) {
  if (!pending_) return;
  pending_ = false;
  quiet_since_ = step;
  cooldown_until_ = step + options_.cooldown_steps;
}

bool AutoscalePolicy::settled() const {
  return workers_ > 0 && !pending_ && stint_measured_ &&
         last_step_ - quiet_since_ >= 2 * options_.window_steps;
}

std::optional<double> AutoscalePolicy::efficiency(int workers) const {
  const auto at = latest_.find(workers), below = latest_.find(workers - 1);
  if (workers < 2 || at == latest_.end() || below == latest_.end()) return std::nullopt;
  const double per_worker_below = below->second.rate / (workers - 1);
  return (at->second.rate - below->second.rate) / per_worker_below;
}

std::optional<SizeRate> AutoscalePolicy::rate(int workers) const {
  const auto it = latest_.find(workers);
  if (it == latest_.end()) return std::nullopt;
  return it->second;
}

void AutoscalePolicy::start_stint(int64_t step, double unix_s, int workers) {
  workers_ = workers;
  stint_start_ = step;
  stint_measured_ = false;
  window_.clear();
  last_step_ = step;
  last_time_ = unix_s;
}

// A record's interval is spread evenly over the steps it covers, and only the steps past the
// stint's warm-up enter the window. A record that goes back (a retried step) or a clock that did
// only moves the anchor: its interval says nothing about a step's length.
void AutoscalePolicy::measure(int64_t step, double unix_s) {
  const int64_t from = last_step_;
  const double began = last_time_;
  last_step_ = std::max(last_step_, step);
  last_time_ = unix_s;
  if (step <= from || !(unix_s > began)) return;
  const double each = (unix_s - began) / static_cast<double>(step - from);
  for (int64_t s = from + 1; s <= step; ++s) {
    if (s <= stint_start_ + kAutoscaleWarmupSteps) continue;
    window_.push_back(each);
    if (static_cast<int64_t>(window_.size()) < options_.window_steps) continue;
    const double mid = median(window_);
    const SizeRate done{workers_, s, mid, static_cast<double>(options_.examples_per_step) / mid};
    measurements_.push_back(done);
    latest_[workers_] = done;
    stint_measured_ = true;
    window_.clear();
  }
}

std::optional<ScaleDecision> AutoscalePolicy::decide(int64_t step, int capacity) {
  if (pending_ || !stint_measured_ || step < cooldown_until_) return std::nullopt;
  const std::optional<double> e = efficiency(workers_);
  if (e && *e < options_.down_efficiency && workers_ - 1 >= options_.min_workers) {
    bad_[workers_] = latest_.at(workers_ - 1).rate;
    ++strikes_[workers_];
    cooldown_until_ = step + options_.cooldown_steps;
    return record(ScaleAction::kRemove, step,
                  "e " + two_decimals(*e) + " < down " + two_decimals(options_.down_efficiency));
  }
  if (workers_ >= options_.max_workers || capacity < 1) return std::nullopt;
  if (e && *e < options_.up_efficiency) return std::nullopt;  // the hysteresis band
  if (strikes_[workers_ + 1] > kBadSizeRetries) return std::nullopt;
  const auto bad = bad_.find(workers_ + 1);
  if (bad != bad_.end()) {
    const double moved = std::abs(latest_.at(workers_).rate - bad->second) / bad->second;
    if (moved <= kRateMovedShare) return std::nullopt;
    bad_.erase(bad);
  }
  return record(ScaleAction::kAdd, step,
                e ? "e " + two_decimals(*e) + " >= up " + two_decimals(options_.up_efficiency)
                  : std::string("no addition measured"));
}

std::optional<ScaleDecision> AutoscalePolicy::record(ScaleAction action, int64_t step,
                                                     std::string reason) {
  ScaleDecision d;
  d.action = action;
  d.step = step;
  d.from = workers_;
  d.to = action == ScaleAction::kAdd ? workers_ + 1 : workers_ - 1;
  d.rate = latest_.at(workers_).rate;
  if (const auto below = rate(workers_ - 1)) d.rate_below = below->rate;
  d.efficiency = efficiency(workers_);
  d.reason = std::move(reason);
  decisions_.push_back(d);
  pending_ = true;
  quiet_since_ = step;
  return d;
}

}  // namespace krab::elastic
