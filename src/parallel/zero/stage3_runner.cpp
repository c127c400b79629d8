#include "parallel/zero/stage3_runner.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/torch.h>

#include <algorithm>
#include <unordered_map>

#include "core/errors.h"
#include "models/recompute.h"

namespace krab::parallel::zero {

namespace {

using torch::autograd::variable_list;

// Identity in both directions; its backward tells the runner that the unit's backward is about
// to run. It is the output's grad_fn and its one next edge is the unit's own output node, so
// autograd runs it before any node of the unit (they need the gradient it passes on).
class BoundaryNode : public torch::autograd::Node {
 public:
  BoundaryNode(Stage3Runner* runner, int unit) : runner_(runner), unit_(unit) {}
  std::string name() const override { return "krab::Stage3BoundaryBackward"; }
  variable_list apply(variable_list&& grads) override {
    runner_->enter_backward(unit_);
    return std::move(grads);
  }

 private:
  Stage3Runner* runner_;
  int unit_;
};

// y behind a BoundaryNode: a view of y (no copy) whose gradient edge is the node, as LibTorch's
// custom functions do with an input they return.
at::Tensor behind_boundary(const at::Tensor& y, Stage3Runner* runner, int unit) {
  auto node = std::make_shared<BoundaryNode>(runner, unit);
  node->set_next_edges(torch::autograd::collect_next_edges(y));
  at::Tensor out = y.view_as(y);
  torch::autograd::set_history(out, node);
  return out;
}

int position(const std::vector<int>& order, int unit) {
  const auto it = std::find(order.rbegin(), order.rend(), unit);
  return it == order.rend() ? -1 : static_cast<int>(order.rend() - it) - 1;
}

}  // namespace

Stage3Runner::Stage3Runner(models::Model& model, const engine::ShardLayout& layout,
                           Stage3Storage& storage,
                           const std::vector<std::vector<at::Tensor>>& params,
                           comm::Communicator& comm, Stage3RunnerOptions options)
    : layout_(layout), storage_(storage), comm_(comm), options_(options), model_(model) {
  KRAB_CHECK_ARG(options_.prefetch >= 0, "parallel.prefetch must be >= 0, got ", options_.prefetch);
  KRAB_CHECK(storage.all_adopted(), "Stage3Runner: every unit must be adopted first");
  std::unordered_map<std::string, int> by_name;
  for (int u = 1; u < layout.num_units(); ++u) {
    by_name[layout.unit(u).name] = u;
    expected_.push_back(u);
  }
  const auto modules = model.named_modules();
  for (const std::string& path : model.unit_candidates()) {
    const auto it = by_name.find(path);
    unit_of_candidate_.push_back(it == by_name.end() ? -1 : it->second);
    const auto* found = modules.find(path);
    recompute_params_.push_back(found ? (*found)->parameters() : std::vector<at::Tensor>{});
    recompute_buffers_.push_back(found ? (*found)->buffers() : std::vector<at::Tensor>{});
  }
  // Every unit must be run through a unit call, or nothing would ever gather it.
  for (const auto& [name, u] : by_name)
    KRAB_CHECK_ARG(std::count(unit_of_candidate_.begin(), unit_of_candidate_.end(), u) == 1,
                   "parallel.wrap: unit '", name,
                   "' is not run through the model's unit calls; parallel.zero_stage 3 can only "
                   "gather those");
  missing_.assign(layout.num_units(), 0);
  std::vector<at::Tensor> hooked;
  for (int u = 1; u < layout.num_units(); ++u)
    for (const at::Tensor& p : params.at(u)) {
      hooked.push_back(p);
      unit_of_hook_.push_back(u);
      ++missing_[u];
    }
  total_ = missing_;
  filled_.assign(hooked.size(), 0);
  hooks_ = std::make_unique<GradReadyHooks>(hooked, [this](int64_t i) { on_grad_ready(i); });
  std::vector<int> identity(unit_of_candidate_.size());
  for (size_t i = 0; i < identity.size(); ++i) identity[i] = static_cast<int>(i);
  model.set_unit_runner(this, identity);
}

Stage3Runner::~Stage3Runner() {
  hooks_.reset();
  if (model_.unit_runner() == this) model_.set_unit_runner(nullptr, {});
}

at::Tensor Stage3Runner::run(int candidate, const at::Tensor& x,
                             const models::UnitForward& forward) {
  KRAB_CHECK(candidate >= 0 && candidate < static_cast<int>(unit_of_candidate_.size()),
             "Stage3Runner: candidate ", candidate, " of ", unit_of_candidate_.size());
  const bool grad = torch::GradMode::is_enabled();
  auto call = [&] {
    if (options_.recompute && grad)
      return models::run_recomputed(x, recompute_params_[candidate], forward,
                                    recompute_buffers_[candidate]);
    return forward(x);
  };
  const int u = unit_of_candidate_[candidate];
  if (u < 0) return call();
  // A unit seen before in this forward: a new forward began; its order is the next guess.
  if (position(order_, u) >= 0) {
    expected_ = std::move(order_);
    order_.clear();
  }
  order_.push_back(u);
  ensure_gathered(u);
  prefetch_after(u);
  at::Tensor y = call();
  const bool backward_follows = grad && y.requires_grad();
  // The last unit of the forward is the first of the backward: keeping it saves a gather.
  const bool last = !expected_.empty() && expected_.back() == u;
  if (!(backward_follows && last)) storage_.free(u);
  if (!backward_follows) return y;
  return behind_boundary(y, this, u);
}

void Stage3Runner::enter_backward(int unit) {
  ensure_gathered(unit);
  prefetch_before(unit);
}

void Stage3Runner::finish_backward() {
  for (int u = 1; u < layout_.num_units(); ++u) storage_.free(u);
  missing_ = total_;
  std::fill(filled_.begin(), filled_.end(), 0);
}

void Stage3Runner::gather_now(int unit) { ensure_gathered(unit); }

void Stage3Runner::on_grad_ready(int64_t index) {
  if (filled_[index]) return;  // a second use of a parameter in one backward
  filled_[index] = 1;
  const int u = unit_of_hook_[index];
  if (--missing_[u] > 0) return;
  // The unit's last gradient: its backward is over (every node that reads the unit's
  // parameters also produces a gradient for them), and GradReducer's hook, registered first,
  // has copied the gradient into the bucket.
  storage_.free(u);
  missing_[u] = total_[u];
  for (size_t i = 0; i < unit_of_hook_.size(); ++i)
    if (unit_of_hook_[i] == u) filled_[i] = 0;
}

void Stage3Runner::prefetch_after(int unit) {
  const int i = position(expected_, unit);
  if (i < 0) return;
  for (int k = 1; k <= options_.prefetch && i + k < static_cast<int>(expected_.size()); ++k)
    storage_.start_gather(expected_[i + k], comm_);
}

void Stage3Runner::prefetch_before(int unit) {
  const int i = position(order_, unit);
  if (i < 0) return;
  for (int k = 1; k <= options_.prefetch && i - k >= 0; ++k)
    storage_.start_gather(order_[i - k], comm_);
}

void Stage3Runner::ensure_gathered(int unit) {
  storage_.start_gather(unit, comm_);
  storage_.wait(unit);
}

}  // namespace krab::parallel::zero
