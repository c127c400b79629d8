#include "models/recompute.h"

#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <torch/torch.h>

#include <mutex>
#include <optional>
#include <utility>

#include "core/errors.h"

namespace krab::models {
namespace {

using torch::autograd::variable_list;

// The thread's CPU autocast state (train.precision's AutocastGuard sets it around the forward).
struct AutocastState {
  bool enabled = false;
  at::ScalarType dtype = at::kBFloat16;

  static AutocastState current() {
    return {at::autocast::is_cpu_enabled(), at::autocast::get_autocast_cpu_dtype()};
  }
};

// Puts the forward's autocast state back for the recompute, which runs in backward, after the
// forward's guard has gone. It nests like the guard does and clears autocast's cast cache when
// the nesting returns to 0, so no bf16 copy of a weight made here outlives the recompute (the
// next step's forward would otherwise find a copy of the weight before the optimizer moved it).
class AutocastRestore {
 public:
  explicit AutocastRestore(AutocastState wanted)
      : saved_(AutocastState::current()), on_(wanted.enabled) {
    at::autocast::set_cpu_enabled(wanted.enabled);
    at::autocast::set_autocast_cpu_dtype(wanted.dtype);
    if (on_) at::autocast::increment_nesting();
  }
  ~AutocastRestore() {
    if (on_ && at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_cpu_enabled(saved_.enabled);
    at::autocast::set_autocast_cpu_dtype(saved_.dtype);
  }
  AutocastRestore(const AutocastRestore&) = delete;
  AutocastRestore& operator=(const AutocastRestore&) = delete;

 private:
  AutocastState saved_;
  bool on_;
};

// The first run happens without gradients, so autocast must not cache its casts: a cached bf16
// weight made under no-grad has no history, and a later use of the same weight in the same
// autocast region, with gradients, would take it and lose the weight's gradient.
class NoAutocastCache {
 public:
  NoAutocastCache() : saved_(at::autocast::is_autocast_cache_enabled()) {
    at::autocast::set_autocast_cache_enabled(false);
  }
  ~NoAutocastCache() { at::autocast::set_autocast_cache_enabled(saved_); }
  NoAutocastCache(const NoAutocastCache&) = delete;
  NoAutocastCache& operator=(const NoAutocastCache&) = delete;

 private:
  bool saved_;
};

at::Tensor generator_state() {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void set_generator_state(const at::Tensor& state) {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

// A unit's buffers as they were before its first run. A forward may update buffers (batch
// norm's running statistics in training mode): the recompute must start from the same values
// and must not apply the update a second time, so it runs on the values from before the first
// run and then puts back what the first run left.
class BufferSnapshot {
 public:
  BufferSnapshot() = default;
  explicit BufferSnapshot(const std::vector<at::Tensor>& buffers) : live_(buffers) {
    torch::NoGradGuard no_grad;
    for (const at::Tensor& b : buffers) before_.push_back(b.clone());
  }
  // Copies the before-values into the live buffers; returns the values they held.
  std::vector<at::Tensor> swap_in_before() {
    torch::NoGradGuard no_grad;
    std::vector<at::Tensor> held;
    for (size_t i = 0; i < live_.size(); ++i) {
      held.push_back(live_[i].clone());
      live_[i].copy_(before_[i]);
    }
    return held;
  }
  void put_back(const std::vector<at::Tensor>& held) {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < held.size(); ++i) live_[i].copy_(held[i]);
  }

 private:
  std::vector<at::Tensor> live_, before_;
};

// Puts a snapshot's before-values into the buffers for its lifetime; what they held comes back
// when it ends (also when the rerun throws).
class BufferSwap {
 public:
  explicit BufferSwap(BufferSnapshot& snapshot)
      : snapshot_(snapshot), held_(snapshot.swap_in_before()) {}
  ~BufferSwap() { snapshot_.put_back(held_); }
  BufferSwap(const BufferSwap&) = delete;
  BufferSwap& operator=(const BufferSwap&) = delete;

 private:
  BufferSnapshot& snapshot_;
  std::vector<at::Tensor> held_;
};

// The backward of run_recomputed. Its next edges are x's and each parameter's (in that order),
// so the gradients it returns reach x's producer and the parameters' AccumulateGrad nodes
// exactly as the plain graph's would: gradient hooks on the parameters fire once, as usual.
class RecomputeNode : public torch::autograd::Node {
 public:
  RecomputeNode(const at::Tensor& x, std::vector<at::Tensor> params, UnitForward forward,
                AutocastState autocast, std::optional<at::Tensor> rng, BufferSnapshot buffers)
      : x_(x, /*is_output=*/false),
        x_requires_grad_(x.requires_grad()),
        params_(std::move(params)),
        buffers_(std::move(buffers)),
        forward_(std::move(forward)),
        autocast_(autocast),
        rng_(std::move(rng)) {}

  std::string name() const override { return "krab::RecomputeBackward"; }

  variable_list apply(variable_list&& grads) override {
    variable_list out(1 + params_.size());
    if (grads.empty() || !grads[0].defined()) return out;
    // unpack() checks the version counter: x modified in place since the forward is an error
    // here, as it would be for any saved tensor.
    at::Tensor x = x_.unpack().detach();
    if (x_requires_grad_) x.requires_grad_(true);
    // The buffers as the first run found them for the rerun; what that run left in them comes
    // back once the rerun's graph is differentiated (its nodes may have saved the buffers:
    // batch norm saves its running statistics, and a copy before the grad would trip their
    // version check).
    BufferSwap swap(buffers_);
    at::Tensor y = rerun(x);

    variable_list inputs;
    std::vector<size_t> slot;
    if (x_requires_grad_) {
      inputs.push_back(x);
      slot.push_back(0);
    }
    for (size_t i = 0; i < params_.size(); ++i)
      if (params_[i].requires_grad()) {
        inputs.push_back(params_[i]);
        slot.push_back(1 + i);
      }
    if (inputs.empty()) return out;
    // A reentrant backward on this thread (design §12, check 7). Outside the autocast
    // restore, as the plain run's backward runs after its guard.
    variable_list got = torch::autograd::grad({y}, inputs, {grads[0]}, /*retain_graph=*/false,
                                              /*create_graph=*/false, /*allow_unused=*/true);
    for (size_t k = 0; k < got.size(); ++k) out[slot[k]] = std::move(got[k]);
    return out;
  }

  void release_variables() override {
    x_.reset_data();
    params_.clear();
    buffers_ = {};
    forward_ = nullptr;
  }

 private:
  // The unit again, with gradients, in the first run's autocast and generator state.
  at::Tensor rerun(const at::Tensor& x) {
    KRAB_CHECK(forward_ != nullptr, "activation checkpointing: a unit's backward ran twice");
    std::optional<at::Tensor> now;
    if (rng_) {
      now = generator_state();
      set_generator_state(*rng_);
    }
    at::Tensor y;
    try {
      torch::AutoGradMode grad_on(true);
      AutocastRestore autocast(autocast_);
      y = forward_(x);
    } catch (...) {
      if (now) set_generator_state(*now);
      throw;
    }
    if (now) set_generator_state(*now);
    return y;
  }

  torch::autograd::SavedVariable x_;
  bool x_requires_grad_;
  std::vector<at::Tensor> params_;
  BufferSnapshot buffers_;
  UnitForward forward_;
  AutocastState autocast_;
  std::optional<at::Tensor> rng_;  // the generator before the first run, if that run drew
};

}  // namespace

at::Tensor run_recomputed(const at::Tensor& x, const std::vector<at::Tensor>& params,
                          const UnitForward& forward, const std::vector<at::Tensor>& buffers) {
  bool needs_grad = x.requires_grad();
  for (const at::Tensor& p : params) needs_grad = needs_grad || p.requires_grad();
  if (!torch::GradMode::is_enabled() || !needs_grad) return forward(x);

  BufferSnapshot snapshot(buffers);
  const at::Tensor rng_before = generator_state();
  at::Tensor y;
  {
    torch::NoGradGuard no_grad;
    NoAutocastCache no_cache;
    y = forward(x);
  }
  KRAB_CHECK(y.defined() && at::isFloatingType(y.scalar_type()),
             "activation checkpointing: a unit must return a floating-point tensor");
  // A view would carry its base's (absent) history: give the node a tensor of its own.
  if (y.is_view()) y = y.clone();
  std::optional<at::Tensor> rng;
  if (!torch::equal(rng_before, generator_state())) rng = rng_before;

  auto node = std::make_shared<RecomputeNode>(x, params, forward, AutocastState::current(),
                                              std::move(rng), std::move(snapshot));
  node->set_next_edges(torch::autograd::collect_next_edges(x, params));
  torch::autograd::set_history(y, node);
  return y;
}

RecomputeRunner::RecomputeRunner(const Model& model) {
  const auto modules = model.named_modules();
  for (const std::string& path : model.unit_candidates()) {
    const auto* found = modules.find(path);
    KRAB_CHECK_ARG(found != nullptr, "activation checkpointing: unit '", path,
                   "' is not a submodule of the model");
    params_.push_back((*found)->parameters());
    buffers_.push_back((*found)->buffers());
  }
}

void RecomputeRunner::install(Model& model) {
  std::vector<int> identity(params_.size());
  for (size_t i = 0; i < identity.size(); ++i) identity[i] = static_cast<int>(i);
  model.set_unit_runner(this, std::move(identity));
}

at::Tensor RecomputeRunner::run(int unit, const at::Tensor& x, const UnitForward& forward) {
  KRAB_CHECK(unit >= 0 && unit < static_cast<int>(params_.size()), "RecomputeRunner: unit ", unit,
             " of ", params_.size());
  return run_recomputed(x, params_[unit], forward, buffers_[unit]);
}

}  // namespace krab::models
