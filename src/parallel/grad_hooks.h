// GradReadyHooks: "this parameter's gradient is ready" callbacks during backward, the signal
// every gradient reducer launches its communication from (DataParallel's buckets, ZeRO's
// reduce-scatters).
//
// A post hook goes on each parameter's gradient accumulator (the autograd node that adds into
// `.grad`); it fires once the accumulator has written the gradient, on the thread running
// backward, with the parameter's index in the list given here. A parameter used twice in one
// forward fires once per use; the callback decides what that means.
//
// Lifetime: LibTorch 1.13 cannot remove a post hook from a node, and an accumulator (with its
// hooks) lives as long as the parameter's autograd graph does. The hooks therefore hold this
// object weakly: once it is destroyed they do nothing, so a new reducer can be built on the
// same parameters (an elastic rebuild, a resharding) and the old hooks never touch freed
// memory. The accumulators are kept alive here: a hook on an accumulator that died (and was
// recreated by the next backward) would silently never fire.
//
// Thread safety: the callback runs on the backward thread; build and destroy on the training
// thread, not during a backward.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

namespace torch::autograd {
struct Node;
}

namespace krab::parallel {

class GradReadyHooks {
 public:
  using Callback = std::function<void(int64_t param)>;

  // Registers a hook on the accumulator of every tensor of `params` (each must require grad);
  // `on_ready(i)` runs when params[i]'s gradient has been accumulated.
  GradReadyHooks(const std::vector<at::Tensor>& params, Callback on_ready);
  ~GradReadyHooks();
  GradReadyHooks(const GradReadyHooks&) = delete;
  GradReadyHooks& operator=(const GradReadyHooks&) = delete;

 private:
  Callback on_ready_;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  // The one strong reference the hooks' weak ones point at.
  std::shared_ptr<GradReadyHooks*> self_;
};

}  // namespace krab::parallel
