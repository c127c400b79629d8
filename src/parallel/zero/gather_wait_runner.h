// GatherWaitRunner: ZeRO stages 1-2 wait for each unit's parameter all-gather right before the
// unit's forward, not for all of them before the step (docs/design/zero-sharding.md §2.3).
//
// After a step, every rank holds only its own shard of the updated parameters; the engine
// starts one all-gather per unit (UnitStorage::start_gather) and the next forward must not read
// a unit before its gather is waited. Waiting for all of them before the first forward leaves
// the forward idle until the last gather is done. Instead:
//
//   after_step         start the gathers in the order the forward needs them: first the units
//                      the forward reads outside any unit candidate (the root: gpt's
//                      embeddings, ln_f and head), then the others by the first candidate that
//                      reads them
//   before_backward    wait for those first units only (plan.before_forward)
//   forward            run_unit(candidate c) → this runner: wait the units of c, then run c
//                      — so the forward of the first candidates overlaps the gathers of the
//                      later ones, which are still on the wire
//   apply / settle     wait for all (nothing may write a flat under a gather)
//
// Which unit is waited where is a pure plan (plan_gather_waits) over the layout's parameter
// names and the model's candidate paths: a unit whose every parameter lies inside candidates
// is waited at the first of those candidates in forward order; a unit with any parameter
// outside all candidates (always the root, when it holds parameters) is waited before the
// forward. That is correct for any wrap as long as a candidate's parameters are read only in
// its run_unit call, which is Model::unit_candidates()' contract (models/units.h).
//
// Activation checkpointing (model.activation_checkpointing): a model has one runner, so this
// one also recomputes. It then runs each candidate through a models::RecomputeRunner after the
// wait; the recompute in backward reads the unit's parameters, whole since the wait.
//
// Thread safety: the training thread only, like the engine that owns it.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/shard_layout.h"
#include "models/model.h"
#include "models/recompute.h"
#include "models/units.h"
#include "parallel/zero/unit_storage.h"

namespace krab::parallel::zero {

struct GatherWaitPlan {
  // Every unit with elements, in the order its gather is started: before_forward first (in
  // unit order), then the others by (first candidate, unit). Units of 0 elements have no
  // gather and are in no list.
  std::vector<int> order;
  // The units waited before the forward starts: read outside the candidates.
  std::vector<int> before_forward;
  // at_candidate[c]: the units waited right before candidate c's forward.
  std::vector<std::vector<int>> at_candidate;
};

// The plan above for `layout`'s units and the model's unit candidates (module paths, forward
// order; parameter "a.b.w" lies in candidate "a.b" and in "a"). Pure. No candidates: every unit
// is waited before the forward.
GatherWaitPlan plan_gather_waits(const engine::ShardLayout& layout,
                                 const std::vector<std::string>& candidates);

class GatherWaitRunner : public models::UnitRunner {
 public:
  // Waits in `storage` (not owned; must outlive the runner) as `plan` says. `recompute`, when
  // given, runs every candidate after its wait (activation checkpointing); it must have been
  // built over the model this runner is installed on.
  GatherWaitRunner(UnitStorage& storage, GatherWaitPlan plan,
                   std::unique_ptr<models::RecomputeRunner> recompute);

  // Installs this runner on `model` for every candidate (unit i = candidate i); uninstall()
  // takes it off again if it is still the model's runner. The engine installs it after
  // building the storage and uninstalls it before the storage goes.
  void install(models::Model& model);
  void uninstall(models::Model& model);

  const GatherWaitPlan& plan() const { return plan_; }
  bool recomputes() const { return recompute_ != nullptr; }

  // Waits the gathers of candidate `unit`'s units, then forward(x) (recomputed in backward
  // with activation checkpointing).
  at::Tensor run(int unit, const at::Tensor& x, const models::UnitForward& forward) override;

 private:
  UnitStorage& storage_;
  GatherWaitPlan plan_;
  std::unique_ptr<models::RecomputeRunner> recompute_;
};

}  // namespace krab::parallel::zero
