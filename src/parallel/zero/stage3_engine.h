// Stage3Engine: ZeRO stage 3 — parameters, gradients and optimizer state all sharded
// (docs/design/zero-sharding.md §1.3, §2.5).
//
// Each rank keeps, per unit (parallel.wrap; the root unit holds what no unit took), an fp32
// master shard of 1/N of the unit's parameters, the optimizer state over it, and between
// backward and update the gradient shard: 16Ψ/N bytes with Adam. The parameters themselves
// are views into one flat storage per unit (Stage3Storage) that holds bytes only while the
// unit runs: Stage3Runner, installed as the model's unit runner, all-gathers a unit before its
// forward and again before its backward (prefetching the next one), and frees it after each.
// The root unit stays gathered: the model uses it outside units (gpt's embeddings and head).
// One step through the Engine calls (engine/engine.h):
//
//   before_backward(m, last)  waits for the root's gather; from the second micro-batch on,
//                             finishes the previous one's reduce-scatters (as stage 2)
//   forward / backward        Stage3Runner gathers and frees around every unit; gradient
//                             hooks copy each unit's gradients into its own bucket and
//                             reduce-scatter it (GradReducer, one unit per bucket), releasing
//                             every .grad
//   reduce_gradients()        the rest of the buckets (the root's last): the grad shards hold
//                             the average; any unit still gathered is freed
//   apply(lr)                 one optimizer per unit steps its master shard
//   after_step(plan)          starts the all-gather of the root's master into the root's flat
//                             (the other units are gathered when they next run); rank 0's
//                             buffers are broadcast
//
// The same parameters as the data-parallel engine: bit for bit on two ranks without gradient
// accumulation, up to the order of additions otherwise (§1.5). Traffic per micro-batch: a
// forward and a backward all-gather and a reduce-scatter of every non-root unit, except that
// the last unit of the forward is not gathered again for its backward; the root's
// reduce-scatter per micro-batch and its all-gather once per step (memory_model.h's
// zero_traffic()).
//
// Compression: comm.compression fp16 or bf16 through the reduce-scatter, as at stage 2.
// Activation checkpointing: the runner recomputes each unit inside its gather
// (models::run_recomputed after the gather), so the trainer installs no runner of its own.
//
// Disk offload (options.offload_dir, parallel.offload: disk): each unit's master shard and its
// optimizer state live in this rank's offload file (offload.h, regions planned with masters),
// so a rank's resident model state is the gradient shard (4Ψ/N) between backward and update,
// the step's two-unit window and the gathered units. The file is made and the room agreed on
// before the first unit is adopted (sharded construction writes each master into it as the
// unit is built); every gather reads its unit's master from the file and drops the pages after;
// apply() steps through DiskOffload's window. The parameters equal those without offload bit
// for bit (the same arithmetic on the same bytes). memory() counts masters and optimizer state
// as offloaded.
//
// Shard replication (options.replicate_shards, elastic membership: buddy.h): rank r also keeps
// a master copy of shard r−1 of every unit (its ward: the storage copies it out of the broadcast
// flat at adoption) and a second set of unit optimizers over it. reduce_gradients() ends with the
// ring exchange of the gradient shards and apply() steps the ward masters after the own ones,
// so they stay equal to the owner's bit for bit; state() hands them out as TrainState::ward, and
// after_restore() re-copies them from their owners (ShardBuddy::resync), so a restore fills the
// own masters only. The parameters are those without replication, bit for bit. Not with offload
// (InvalidArgument naming both keys); a group of one has no buddy and replicates nothing.
//
// Checkpoints: state() hands out the master shards and their optimizers (views of the offload
// file with offload: a checkpoint reads them from it, a restore writes into it, and the shard
// files are the same bytes either way); after_restore() drops the restored pages of the
// offload file and gathers the root (the other units are gathered from the restored masters
// when they run). visit_parameters() hands out every parameter whole, one unit gathered at a
// time (model.pt).
//
// Thread safety: one training thread, like every engine.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "compress/options.h"
#include "engine/engine.h"
#include "engine/shard_layout.h"
#include "engine/sharded_state.h"
#include "models/model.h"
#include "parallel/dp_engine.h"
#include "parallel/zero/buddy.h"
#include "parallel/zero/grad_reducer.h"
#include "parallel/zero/shard_optimizer.h"
#include "parallel/zero/stage3_runner.h"
#include "parallel/zero/stage3_storage.h"

namespace krab::parallel::zero {

struct Stage3EngineOptions {
  // Module-path globs picking the units among the model's unit candidates (plan.h). Ignored
  // when wrap_auto: then every candidate is a unit.
  std::vector<std::string> wrap;
  bool wrap_auto = true;
  int64_t alignment = 16;  // shard alignment in elements (plan.h's shard_alignment)
  int prefetch = 1;        // parallel.prefetch: units gathered ahead
  bool activation_checkpointing = false;
  compress::CompressionOptions compression;  // none, fp16 or bf16
  // parallel.offload: disk puts this rank's masters and optimizer state in
  // OFFLOAD_DIR/rank-R.bin (the trainer passes RUN_DIR/offload); empty keeps them in RAM.
  std::string offload_dir;
  // elastic.replicate_shards: keep a copy of the previous rank's shard (buddy.h).
  bool replicate_shards = false;
  // False for an elastic run's later generations: the units are adopted blank
  // (Stage3Storage::adopt_blank: the model's values are not read, the masters are 0), only
  // buffers and frozen parameters come from rank 0, and the caller fills the masters
  // (train/live_reshard.h) and calls after_restore(), as a resume does. Not with offload.
  bool broadcast_initial_state = true;
  // total_steps, global_micro_batch, broadcast_buffers, as for the data-parallel engine (the
  // bucket cap is not used: every unit is its own bucket, so its gradient goes at once).
  DataParallelEngineOptions data_parallel;
};

// The units of stage 3 for a model with these trainable parameters and unit candidates: every
// candidate when options.wrap_auto, else the candidates options.wrap picks (plan.h's refusals);
// all in the root when there are no candidates (a unit no unit call runs would never be
// gathered). Laid out for `world` ranks. Pure.
engine::ShardLayout plan_stage3_layout(const std::vector<engine::ParamShape>& params,
                                       const std::vector<std::string>& candidates,
                                       const Stage3EngineOptions& options, int world);

// Collective: this rank's offload file for `layout` — one region per unit holding its master
// shard and the fields of the optimizer `make_optimizer` makes (probed over a stand-in tensor) —
// once every rank agreed there is room (open_offload). Null when `dir` is empty.
std::unique_ptr<DiskOffload> open_stage3_offload(const engine::ShardLayout& layout,
                                                 comm::Communicator& comm, const std::string& dir,
                                                 const OptimizerFactory& make_optimizer);

// The shard whose copy this rank keeps (Stage3Storage's ward): ward_shard(rank, size) with
// options.replicate_shards on a group of two or more, else -1. InvalidArgument for
// replicate_shards with offload_dir.
int stage3_ward(const Stage3EngineOptions& options, const comm::Communicator& comm);

class Stage3Engine : public engine::Engine {
 public:
  // Plans the units from the model's unit candidates (plan_stage3_layout), moves every unit's
  // parameters into its flat (broadcast from rank 0; rank 0's buffers and frozen parameters
  // too), keeps the master shards, frees every non-root flat, installs the runner and builds
  // one optimizer per master shard. With `built` (sharded construction, stage3_build.h) the
  // units were adopted while the model was built: its layout must be the one planned here
  // (Error otherwise), its masters must be in an offload file exactly when
  // options.offload_dir is set, and it must keep the ward masters stage3_ward() names.
  // InvalidArgument for a wrap plan_units refuses, an optimizer
  // ShardOptimizers refuses, offload files that do not fit (open_offload); krab::Error naming
  // the file when it cannot be allocated.
  Stage3Engine(std::shared_ptr<models::Model> model, std::unique_ptr<comm::Communicator> comm,
               Stage3EngineOptions options, const OptimizerFactory& make_optimizer,
               std::unique_ptr<Stage3Storage> built = nullptr);
  ~Stage3Engine() override;

  std::string name() const override { return "sync"; }
  models::Model& model() override { return *model_; }
  void start_at(int64_t step) override { steps_.start_at(step); }
  std::optional<engine::StepPlan> next_step() override { return steps_.next(*comm_); }
  void before_backward(int64_t micro, bool last) override;
  void reduce_gradients() override;
  void apply(double lr) override;
  void after_step(const engine::StepPlan& plan) override;
  comm::Communicator* group() override { return comm_.get(); }
  // Engine::take_group. apply() stays local (it steps the masters); state() hands out the
  // masters of the generation that ended.
  std::unique_ptr<comm::Communicator> take_group() override { return std::move(comm_); }
  engine::TrainState state() override;
  void settle() override;
  void after_restore() override;
  engine::MemoryStats memory() const override;
  nlohmann::json describe() const override;

  // Collective: fn sees every trainable and frozen parameter whole, in named_parameters order;
  // each unit is gathered for its parameters and freed after them (one unit at a time).
  bool visit_parameters(const engine::ParameterVisitor& fn) override;
  // Collective: every unit gathered while fn runs, freed after.
  void with_whole_model(const std::function<void()>& fn) override;

  const engine::ShardLayout& layout() const { return layout_; }
  // The model, for the engine of an elastic run's next generation (built on the same one).
  const std::shared_ptr<models::Model>& shared_model() const { return model_; }
  const Stage3Storage& storage() const { return *storage_; }
  const GradReducer& reducer() const { return *reducer_; }
  // The copy of the ward's shard (replicate_shards on a group of two or more), else null.
  const ShardBuddy* buddy() const { return buddy_.get(); }

 private:
  std::shared_ptr<models::Model> model_;
  std::unique_ptr<comm::Communicator> comm_;
  Stage3EngineOptions options_;
  DataParallelSteps steps_;
  int rank_;  // this rank's shard of layout_
  engine::ShardLayout layout_;
  std::vector<std::string> gathered_whole_;
  // Destroyed in reverse: the runner (hooks, model's runner slot) and the reducer before the
  // storage (gathers in flight) before the communicator.
  std::unique_ptr<Stage3Storage> storage_;
  std::unique_ptr<GradReducer> reducer_;
  std::unique_ptr<Stage3Runner> runner_;
  std::unique_ptr<ShardOptimizers> optimizers_;
  std::unique_ptr<ShardBuddy> buddy_;  // steps the storage's ward masters
  engine::ShardedState sharded_;
};

}  // namespace krab::parallel::zero
