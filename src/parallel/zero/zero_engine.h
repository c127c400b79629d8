// ZeroEngine: sharded data parallelism, ZeRO stages 1 and 2 (docs/design/zero-sharding.md §2).
//
// Every rank still computes a full forward and backward on its slice of each global
// micro-batch (the steps are handed out exactly as the data-parallel engine's), and every rank
// still holds all parameters between steps; what is sharded is the rest:
//
//   stage 1  optimizer state: each rank keeps the state of its shard of every unit and updates
//            only that shard; gradients accumulate locally in .grad and are reduce-scattered
//            on the step's last micro-batch;
//   stage 2  also the gradients: every micro-batch's gradients are reduce-scattered (and added
//            up) into this rank's gradient shards, and a parameter's .grad is released as soon
//            as it is copied into its bucket.
//
// The parameters live in one flat fp32 storage per unit (UnitStorage; units from
// `parallel.wrap`, parallel/zero/plan.h), padded so that rank r owns an equal, aligned chunk.
// One step through the Engine calls (engine/engine.h):
//
//   before_backward(m, last)  waits for the previous step's all-gathers of the units the
//                             forward reads outside its unit candidates (the root); stage 2:
//                             finishes micro-batch m-1's reduce-scatters; arms the gradient
//                             hooks (stage 1: on the last micro-batch only)
//   forward                   each unit's gather is waited right before the unit runs
//                             (GatherWaitRunner, installed on the model), so the forward of the
//                             first units overlaps the gathers of the later ones
//   backward                  hooks copy gradients into rank-major buckets, reduce-scatters
//                             start in bucket order (GradReducer)
//   reduce_gradients()        the rest of the buckets: the grad shards hold the average
//   apply(lr)                 waits for any gather still pending, then one optimizer per unit
//                             steps this rank's shard in place (ShardOptimizers); every
//                             gradient is released
//   after_step(plan)          broadcasts rank 0's buffers as the data-parallel engine does,
//                             then starts the all-gather of every shard into its flat, in the
//                             order the next forward needs them (waited per unit as above, or
//                             all by settle())
//
// With the same model, data and optimizer this ends every step with the parameters of the
// data-parallel engine: bit for bit on two ranks without gradient accumulation, up to the
// order of additions otherwise (§1.5). Traffic per step: a reduce-scatter and an all-gather of
// every unit's padded size, the bytes of one all-reduce (memory_model.h's zero_traffic()).
//
// Compression: comm.compression fp16 or bf16 runs through the reduce-scatter
// (sharded_compression.h) and equals stage 0 with the same codec.
//
// Offload: with options.offload_dir the optimizer state lives in a mapped file (offload.h) and
// apply() steps it unit by unit through a two-unit window; memory() counts it as offloaded.
// Before any rank creates its file, every rank checks that its file system has room for all
// ranks' files (+5%) and all refuse together (InvalidArgument naming parallel.offload).
//
// Activation checkpointing (options.activation_checkpointing): the model has one unit runner, this
// engine's GatherWaitRunner, and it recomputes each unit after waiting its gather (the trainer
// installs no RecomputeRunner when an engine installed a runner).
//
// Checkpoints: state() hands out this rank's shard of every unit and its optimizer
// (engine::ShardedState); after_restore() gathers restored shards into the parameters.
//
// Shard replication (options.replicate_shards, elastic membership: buddy.h): rank r also keeps
// the optimizer state of shard r−1 (its ward) and steps the ward's chunk of every flat with it.
// reduce_gradients() then ends with the ring exchange of the gradient shards (sends this rank's
// to r+1, receives the ward's from r−1) and apply() steps the ward after the own shard; the
// all-gather after the step overwrites the ward's chunk with the owner's bits, which are the
// same. state() hands the ward out as TrainState::ward; after_restore() re-copies every ward
// from its owner (ShardBuddy::resync), so a restore fills the own shards only. The parameters
// are those without replication, bit for bit. Not with offload (InvalidArgument naming both keys);
// a group of one has no buddy and replicates nothing.
//
// Thread safety: one training thread, like every engine.
#pragma once

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
#include "parallel/zero/gather_wait_runner.h"
#include "parallel/zero/grad_reducer.h"
#include "parallel/zero/offload.h"
#include "parallel/zero/shard_optimizer.h"
#include "parallel/zero/unit_storage.h"

namespace krab::parallel::zero {

struct ZeroEngineOptions {
  int stage = 1;  // 1 or 2
  // parallel.wrap's text: "auto" (the model's unit candidates) or module-path globs (plan.h's
  // plan_wrap).
  std::string wrap = "auto";
  // model.activation_checkpointing: the engine's unit runner recomputes every unit.
  bool activation_checkpointing = false;
  int64_t alignment = 16;  // shard alignment in elements (plan.h's shard_alignment)
  // comm.compression: none, fp16 or bf16 (sharded_compression.h).
  compress::CompressionOptions compression;
  // parallel.offload: disk puts this rank's optimizer state in OFFLOAD_DIR/rank-R.bin
  // (offload.h; the trainer passes RUN_DIR/offload); empty keeps it in RAM.
  std::string offload_dir;
  // elastic.replicate_shards: keep a copy of the previous rank's shard (buddy.h).
  bool replicate_shards = false;
  // False for an elastic run's later generations: only buffers and frozen parameters come
  // from rank 0; the trainable values are whatever the model holds, and the caller fills the
  // shards (train/live_reshard.h) and calls after_restore(), as a resume does.
  bool broadcast_initial_state = true;
  // total_steps, global_micro_batch, bucket cap (data_parallel.bucket_mb), broadcast_buffers;
  // as for the data-parallel engine (data_parallel.broadcast_initial_state is always on).
  DataParallelEngineOptions data_parallel;
};

// The layout a ZeroEngine plans for `model` on `world` ranks: its trainable parameters in
// order, grouped by `wrap` (ZeroEngineOptions::wrap), shards aligned to `alignment`. An elastic
// run's later generation plans the previous world's layout with it (train/live_reshard.h).
// InvalidArgument as plan_wrap, or when the model has no trainable parameters.
engine::ShardLayout plan_zero_layout(models::Model& model, const std::string& wrap, int world,
                                     int64_t alignment);

class ZeroEngine : public engine::Engine {
 public:
  // Broadcasts rank 0's parameters and buffers (every replica starts equal; without
  // options.broadcast_initial_state the buffers and frozen parameters only), plans the units
  // and their layout, moves the parameters into the unit flats, registers the gradient hooks,
  // builds one optimizer per unit shard and installs its unit runner on the model (taken off
  // again by the destructor). InvalidArgument for a stage other than 1 or 2,
  // a wrap plan_units refuses, an optimizer ShardOptimizers refuses, offload files that do
  // not fit (check_offload_room) or offload with replicate_shards; krab::Error naming the file
  // when it cannot be allocated.
  ZeroEngine(std::shared_ptr<models::Model> model, std::unique_ptr<comm::Communicator> comm,
             ZeroEngineOptions options, const OptimizerFactory& make_optimizer);
  ~ZeroEngine() override;

  std::string name() const override { return "sync"; }
  models::Model& model() override { return *model_; }
  void start_at(int64_t step) override { steps_.start_at(step); }
  std::optional<engine::StepPlan> next_step() override { return steps_.next(*comm_); }
  void after_compute(double seconds) override { steps_.after_compute(seconds); }
  void before_backward(int64_t micro, bool last) override;
  void reduce_gradients() override;
  void apply(double lr) override;
  void after_step(const engine::StepPlan& plan) override;
  comm::Communicator* group() override { return comm_.get(); }
  // Engine::take_group. apply() stays local (it steps the shards in place); state() hands out
  // the shards of the generation that ended.
  std::unique_ptr<comm::Communicator> take_group() override { return std::move(comm_); }
  engine::TrainState state() override;
  void settle() override { storage_->wait(); }
  void after_restore() override;
  engine::MemoryStats memory() const override;
  nlohmann::json describe() const override;

  const engine::ShardLayout& layout() const { return layout_; }
  const UnitStorage& storage() const { return *storage_; }
  const GradReducer& reducer() const { return *reducer_; }
  const DiskOffload* offload() const { return offload_.get(); }
  // The copy of the ward's shard (replicate_shards on a group of two or more), else null.
  const ShardBuddy* buddy() const { return buddy_.get(); }
  // Null when the model has no unit candidates (every gather is then waited before forward).
  const GatherWaitRunner* gather_wait() const { return gather_wait_.get(); }

 private:
  void start_offload(const std::vector<at::Tensor>& shards);
  void install_gather_wait();
  void start_buddy(const OptimizerFactory& make_optimizer);

  std::shared_ptr<models::Model> model_;
  std::unique_ptr<comm::Communicator> comm_;
  ZeroEngineOptions options_;
  DataParallelSteps steps_;
  int rank_;  // this rank's shard of layout_
  std::vector<at::Tensor> trainable_;
  engine::ShardLayout layout_;
  // Declared in dependency order: destroyed in reverse, the reducer (hooks, buckets in
  // flight) before the storage (gathers in flight) before the communicator.
  std::unique_ptr<UnitStorage> storage_;
  std::unique_ptr<GradReducer> reducer_;
  std::unique_ptr<ShardOptimizers> optimizers_;
  std::unique_ptr<DiskOffload> offload_;           // after the optimizers: its state is theirs
  std::unique_ptr<ShardBuddy> buddy_;              // views of the flats: after the storage
  GatherWaitPlan waits_;                           // which gather is waited where
  std::unique_ptr<GatherWaitRunner> gather_wait_;  // uses the storage; uninstalled first
  std::string wrap_source_;                        // plan.h's wrap_source, for describe()
  engine::ShardedState sharded_;
};

}  // namespace krab::parallel::zero
