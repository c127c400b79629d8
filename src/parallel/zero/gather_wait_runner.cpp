#include "parallel/zero/gather_wait_runner.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "core/errors.h"

namespace krab::parallel::zero {
namespace {

// The index of the candidate whose module holds parameter `name`, or -1. Candidates do not nest
// (Model::unit_candidates: top-level children, list elements), so at most one matches.
int candidate_of(const std::string& name, const std::vector<std::string>& candidates) {
  for (size_t c = 0; c < candidates.size(); ++c) {
    const std::string& path = candidates[c];
    if (name.size() > path.size() && name.compare(0, path.size(), path) == 0 &&
        name[path.size()] == '.')
      return static_cast<int>(c);
  }
  return -1;
}

}  // namespace

GatherWaitPlan plan_gather_waits(const engine::ShardLayout& layout,
                                 const std::vector<std::string>& candidates) {
  GatherWaitPlan plan;
  plan.at_candidate.resize(candidates.size());
  constexpr int kBeforeForward = -1;
  std::vector<std::pair<int, int>> later;  // (first candidate, unit)
  for (int u = 0; u < layout.num_units(); ++u) {
    const engine::UnitLayout& unit = layout.unit(u);
    if (unit.padded == 0) continue;  // no elements, no gather
    int first = std::numeric_limits<int>::max();
    for (const engine::ParamSpan& p : unit.params) {
      const int c = candidate_of(p.name, candidates);
      first = std::min(first, c < 0 ? kBeforeForward : c);
    }
    if (first == kBeforeForward) {
      plan.before_forward.push_back(u);
    } else {
      later.emplace_back(first, u);
      plan.at_candidate[first].push_back(u);
    }
  }
  std::sort(later.begin(), later.end());
  plan.order = plan.before_forward;
  for (const auto& [c, u] : later) plan.order.push_back(u);
  return plan;
}

GatherWaitRunner::GatherWaitRunner(UnitStorage& storage, GatherWaitPlan plan,
                                   std::unique_ptr<models::RecomputeRunner> recompute)
    : storage_(storage), plan_(std::move(plan)), recompute_(std::move(recompute)) {
  KRAB_CHECK(!recompute_ || recompute_->units() == plan_.at_candidate.size(),
             "GatherWaitRunner: a recompute runner over ", recompute_ ? recompute_->units() : 0,
             " units for ", plan_.at_candidate.size(), " candidates");
}

void GatherWaitRunner::install(models::Model& model) {
  std::vector<int> identity(plan_.at_candidate.size());
  for (size_t i = 0; i < identity.size(); ++i) identity[i] = static_cast<int>(i);
  model.set_unit_runner(this, std::move(identity));
}

void GatherWaitRunner::uninstall(models::Model& model) {
  if (model.unit_runner() == this) model.set_unit_runner(nullptr, {});
}

at::Tensor GatherWaitRunner::run(int unit, const at::Tensor& x,
                                 const models::UnitForward& forward) {
  // Waiting a unit twice (a candidate called again, evaluation after settle()) is a no-op.
  for (int u : plan_.at_candidate.at(unit)) storage_.wait(u);
  return recompute_ ? recompute_->run(unit, x, forward) : forward(x);
}

}  // namespace krab::parallel::zero
