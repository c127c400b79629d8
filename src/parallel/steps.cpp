#include "parallel/steps.h"

#include <torch/torch.h>

#include <cmath>

#include "comm/communicator.h"
#include "core/errors.h"

namespace krab::parallel {

void DataParallelSteps::start_at(int64_t step) {
  next_ = step;
  window_us_ = window_steps_ = 0;  // a resumed run measures afresh, from equal slices
}

std::optional<engine::StepPlan> DataParallelSteps::next(comm::Communicator& group) {
  if (next_ >= total_) return std::nullopt;
  const int world = group.size();
  if (sizes_.empty())
    for (int r = 0; r < world; ++r)
      sizes_.push_back(data::equal_slice(global_micro_batch_, r, world).size());
  if (balance_.every > 0 && window_steps_ == balance_.every) rebalance(group);
  int64_t begin = 0;
  for (int r = 0; r < group.rank(); ++r) begin += sizes_[r];
  const int64_t n = sizes_[group.rank()];
  engine::StepPlan plan{next_++, {begin, begin + n}};
  // W · n / B from integers: exactly 1.0 when every slice holds B / W examples.
  if (world * n != global_micro_batch_)
    plan.weight = static_cast<double>(world * n) / static_cast<double>(global_micro_batch_);
  return plan;
}

void DataParallelSteps::after_compute(double seconds) {
  window_us_ += std::llround(seconds * 1e6);
  ++window_steps_;
}

// Every rank enters at the same step (each counts one after_compute per step), contributes its
// mean in its own slot of a zeroed vector, and the sum places every rank's value.
void DataParallelSteps::rebalance(comm::Communicator& group) {
  at::Tensor times = torch::zeros({group.size()}, torch::kInt64);
  times[group.rank()] = window_us_ / window_steps_;
  group.allreduce(times)->wait();
  const std::vector<int64_t> us(times.data_ptr<int64_t>(),
                                times.data_ptr<int64_t>() + group.size());
  window_us_ = window_steps_ = 0;
  SlicePlan plan = balance_.plan(sizes_, us, memory_);
  memory_ = std::move(plan.memory);
  std::vector<int64_t> planned = std::move(plan.sizes);
  int64_t sum = 0;
  for (int64_t n : planned) {
    KRAB_CHECK(n >= 1, "a slice of ", n, " examples");
    sum += n;
  }
  KRAB_CHECK(planned.size() == sizes_.size() && sum == global_micro_batch_,
             "the balancer's slices do not tile the global micro-batch");
  if (planned == sizes_) return;
  sizes_ = std::move(planned);
  changes_.emplace_back(next_, sizes_);
}

nlohmann::json DataParallelSteps::describe() const {
  if (balance_.every <= 0) return nullptr;
  nlohmann::json changes = nlohmann::json::array();
  for (const auto& [step, sizes] : changes_) {
    nlohmann::json row = {step};
    for (int64_t n : sizes) row.push_back(n);
    changes.push_back(row);
  }
  return {{"every", balance_.every}, {"changes", changes}};
}

}  // namespace krab::parallel
