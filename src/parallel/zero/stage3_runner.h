// Stage3Runner: the UnitRunner of ZeRO stage 3 — each unit's parameters exist only while the
// unit runs, forward and backward (docs/design/zero-sharding.md §2.5, §3.5).
//
// The model calls run(candidate, x, forward) for each of its unit candidates
// (models/units.h). For a candidate that is a unit of the layout:
//
//   forward   wait for the unit's gather (start it if no prefetch did) | start the gathers of
//             the next `prefetch` units in the expected forward order | y = forward(x) (through
//             models::run_recomputed with activation checkpointing) | free the unit, unless it
//             is the last in the expected order and a backward will follow (it is needed again
//             at once) | return y behind a BoundaryNode
//   backward  the BoundaryNode runs before any of the unit's own backward nodes (it produces
//             the gradient they consume): gather the unit (wait a prefetch) | start the gathers
//             of the `prefetch` units before it in this forward's recorded order | pass the
//             gradient through. With checkpointing the recompute runs after it, on the gathered
//             unit. When every parameter of the unit has its gradient (a gradient-ready hook
//             counts them; GradReducer's own hooks have copied it into the unit's bucket by
//             then), the unit is freed.
//
// The expected order is the previous forward's recorded order (the layout's before the first
// forward). A new forward is recognised by a unit running a second time; a wrong guess costs
// a wasted gather, issued identically on every rank. Everything here runs on the training
// thread (LibTorch's CPU backward runs on the thread that called backward()), in an order the
// graph fixes, so every rank issues the same collectives in the same order.
//
// Without gradients (evaluation) a unit is freed after its forward and no node is attached.
// finish_backward() (after a micro-batch's backward) frees any unit still gathered — one whose
// parameters did not all get a gradient — and resets the counts; the root unit is never freed
// here (it stays gathered: the model uses it outside units).
//
// A candidate that is not a unit of the layout (its parameters are in the root) runs directly,
// or through run_recomputed with checkpointing.
//
// Thread safety: the training thread only. The runner must outlive any graph it attached a node
// to (the engine that owns it outlives the steps).
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "engine/shard_layout.h"
#include "models/model.h"
#include "parallel/grad_hooks.h"
#include "parallel/zero/stage3_storage.h"

namespace krab::parallel::zero {

struct Stage3RunnerOptions {
  int prefetch = 1;        // units gathered ahead, forward and backward; >= 0
  bool recompute = false;  // model.activation_checkpointing
};

class Stage3Runner : public models::UnitRunner {
 public:
  // `model`'s unit candidates are matched to `layout`'s units by module path; `params[u]` are
  // unit u's parameters (layout order). The storage must have adopted every unit. Installs
  // itself on `model` (one runner per model).
  Stage3Runner(models::Model& model, const engine::ShardLayout& layout, Stage3Storage& storage,
               const std::vector<std::vector<at::Tensor>>& params, comm::Communicator& comm,
               Stage3RunnerOptions options);
  ~Stage3Runner() override;

  at::Tensor run(int candidate, const at::Tensor& x, const models::UnitForward& forward) override;

  // The BoundaryNode of unit `unit` runs: see the class comment.
  void enter_backward(int unit);
  // After a micro-batch's backward (and its reduce): frees every non-root unit still allocated.
  void finish_backward();

  // Gathers unit `unit` and waits (collective; for visitors of the whole parameters).
  void gather_now(int unit);

 private:
  void on_grad_ready(int64_t index);
  void prefetch_after(int unit);
  void prefetch_before(int unit);
  void ensure_gathered(int unit);

  const engine::ShardLayout& layout_;
  Stage3Storage& storage_;
  comm::Communicator& comm_;
  Stage3RunnerOptions options_;
  models::Model& model_;
  std::vector<int> unit_of_candidate_;                      // layout unit, or -1
  std::vector<std::vector<at::Tensor>> recompute_params_;   // by candidate: the module's
  std::vector<std::vector<at::Tensor>> recompute_buffers_;  // parameters and buffers
  std::vector<int> expected_;  // the forward order expected (previous forward's)
  std::vector<int> order_;     // this forward's units so far
  // Gradient-ready counting: hook index -> unit, and per unit how many are still missing.
  std::vector<int> unit_of_hook_;
  std::vector<char> filled_;
  std::vector<int64_t> missing_, total_;
  std::unique_ptr<GradReadyHooks> hooks_;  // last: destroyed first
};

}  // namespace krab::parallel::zero
