// Engine: how one rank turns gradients into updates. The training loop (train/trainer.h)
// owns everything that does not depend on that — data, schedule, evaluation, checkpoints,
// progress, the report — and drives an Engine through one step at a time:
//
//   while (plan = engine.next_step())                     which step, which slice of its batch
//     for each micro-batch m of plan:
//       engine.before_backward(m, last)                   e.g. communicate only on the last
//       loss = model.loss(model.forward(x), y); backward
//     engine.reduce_gradients()                           all-reduce, compress, push to a server
//     engine.apply(lr)                                    optimizer step (or nothing: a server)
//     engine.after_step(plan)                             e.g. local SGD's periodic average
//   engine.finish(summary)
//
// Engines today: data parallel (parallel/dp_engine.h: full replica, gradients averaged by
// DataParallel and its comm hook), local SGD (sync/local_sgd.h: a data-parallel engine that
// averages models every period) and the parameter-server worker (sync/ps_worker.h: no
// collective group; a server hands out steps and applies the updates). A sharded (ZeRO)
// engine returns its own part from state(); an elastic one changes the slices next_step()
// hands out; a pipeline engine runs its micro-batch schedule behind the same calls.
//
// This header sits below train/, parallel/ and sync/: the engines implement it, train/ drives it.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "data/sampler.h"

namespace at {
class Tensor;
}
namespace torch::optim {
class Optimizer;
}
namespace krab::comm {
class Communicator;
}
namespace krab::models {
class Model;
}
namespace krab::engine {
struct ShardedState;  // engine/sharded_state.h
}

namespace krab::engine {

// The work of one step on this rank: global step `step` (each has `micro_batches` global
// micro-batches, numbered step · micro_batches + m for the sampler) and this rank's `slice`
// of each. The global batch sequence depends only on the seed (data/sampler.h); the engine
// only decides which part of it this rank computes.
//
// `weight`: how much this rank's gradient weighs in the group's average, W · n / B for a slice
// of n of the B examples of a global micro-batch on W ranks. Every reduction averages over
// ranks (ReduceOp::kAvg, the compressors, ZeRO's reduce-scatter), so with unequal slices (the
// load balancer, parallel.balance) the loop multiplies each micro-batch's loss by it before
// backward, and the average the reductions take is the global batch's mean gradient. Exactly
// 1.0 when the slices are equal: the loop then multiplies nothing, so a run with equal slices
// is bit-identical to one without a balancer (docs/design/elastic.md §5.2).
struct StepPlan {
  int64_t step = 0;
  data::BatchSlice slice;
  double weight = 1.0;
};

// What a checkpoint holds of this rank.
// - A full replica (data parallel, local SGD, a server's worker): shard 0 of 1, `sharded`
//   null; the model's parameters and buffers and `optimizer`'s state. Rank 0 writes it.
// - A sharded engine (ZeRO stages 1-3): shard `shard` of `shards` (= the group's rank and
//   size), `sharded` set: this rank's piece of every unit's flat parameters and of its
//   optimizer state (engine/sharded_state.h). `model` still holds the buffers and any frozen
//   parameters (replicated); `optimizer` is null. Every rank writes its own shard.
struct TrainState {
  models::Model* model = nullptr;
  torch::optim::Optimizer* optimizer = nullptr;  // null: none whole (a server's, or sharded)
  int shard = 0;
  int shards = 1;
  const ShardedState* sharded = nullptr;
  // With ZeRO shard replication (parallel/zero/buddy.h): this rank's copy of shard
  // `ward_shard` of the same layout (values and optimizers), which rank ward_shard owns. Null and
  // -1 without it. Sharded checkpoints ignore it (the owner writes that shard); a live reshard
  // reads and fills it (docs/design/elastic.md §4.3).
  const ShardedState* ward = nullptr;
  int ward_shard = -1;
};

// What this rank holds, in bytes, for the report's `memory` (docs/design/zero-sharding.md
// §5.3). Storage bytes, each storage counted once; `known` false for an engine that does not
// measure (the report then leaves the fields out).
struct MemoryStats {
  bool known = false;
  int64_t params = 0;            // parameter storage held between steps (stage 3: master shards)
  int64_t grads = 0;             // gradients held between backward and update
  int64_t optimizer = 0;         // optimizer state in memory
  int64_t working_set_peak = 0;  // the most transient bytes (gathered units, buckets) at once
  int64_t offloaded = 0;         // optimizer state (and stage-3 masters) in files on disk
};

// Called with each parameter's name and whole value (Engine::visit_parameters).
using ParameterVisitor = std::function<void(const std::string& name, const at::Tensor& value)>;

// What the loop measured, for engines that report it elsewhere (the parameter-server worker
// hands it to its server, which writes the job's report).
struct Evaluation {
  int64_t step = 0;
  double seconds = 0;
  double test_accuracy = 0;  // train.metric accuracy
  double test_loss = 0;      // train.metric loss
};
struct RunSummary {
  int64_t steps = 0;
  double seconds = 0;
  double final_loss = 0;
  std::vector<Evaluation> evals;
};

// A piece of a step that the engine ran alongside the loop's calls (a bucket's reduction, from
// its launch during backward to the end of its wait), for the trace and the bottleneck report
// (train/step_phases.h). `name` is one of step_phases.h's engine spans ("comm.bucket.3").
struct PhaseSpan {
  std::string name;
  std::chrono::steady_clock::time_point start;
  double seconds = 0;
};

// How the loop evaluates during training.
enum class EvaluationMode {
  kCollective,  // every rank evaluates its share of the test split; a sum over the group
  kDeferred,    // rank 0 keeps a copy of the parameters and evaluates after training (an
                // evaluation inside the loop would make it a straggler for everyone)
};

class Engine {
 public:
  virtual ~Engine() = default;

  // "sync", "local_sgd", "async": the report's sync_mode.
  virtual std::string name() const = 0;
  virtual models::Model& model() = 0;

  // Training resumes after `step` completed steps (a checkpoint); before the first next_step().
  virtual void start_at(int64_t step) {}
  // The next step this rank computes, or nullopt when training is over.
  virtual std::optional<StepPlan> next_step() = 0;
  // Before micro-batch `micro`'s backward; `last` for the step's final micro-batch.
  virtual void before_backward(int64_t micro, bool last) {}
  // After the step's last backward: the gradients every replica applies are in place.
  virtual void reduce_gradients() = 0;
  // The update at learning rate `lr`; gradients cleared.
  virtual void apply(double lr) = 0;
  // After the step's forward and backward on this rank (before reduce_gradients): the seconds
  // they took, the artificial straggler's delay included (train.slow_rank). What the load
  // balancer weighs ranks by; an engine without one ignores it.
  virtual void after_compute(double seconds) {}
  // After the update of `plan`'s step.
  virtual void after_step(const StepPlan& plan) {}
  // Called between long pieces of work outside the loop (deferred evaluations), so that a
  // server does not count this worker out.
  virtual void keep_alive() {}
  // The end of training on this rank.
  virtual void finish(const RunSummary& summary) {}

  // The collective group the loop uses for global quantities (evaluation, final loss,
  // checkpoint resume), or null when there is none (parameter-server workers).
  virtual comm::Communicator* group() = 0;
  virtual EvaluationMode evaluation_mode() const { return EvaluationMode::kCollective; }

  // Checkpoints: what to save and where to restore into (see TrainState).
  virtual TrainState state() = 0;
  // Parameters may be in flight between steps (a sharded engine's deferred all-gathers):
  // anything outside the step that reads the model's parameters (evaluation, checkpoints,
  // model.pt, snapshots) calls settle() first. Collective where the engine has a group: every
  // rank calls it at the same points. Default: nothing is ever in flight.
  virtual void settle() {}
  // After the loop wrote a checkpoint's values into state(): derive what the engine keeps from
  // them (a sharded engine all-gathers the restored shards into the parameters). Collective.
  virtual void after_restore() {}
  // This rank's bytes by kind (MemoryStats); cheap, called once at the end.
  virtual MemoryStats memory() const { return {}; }

  // For an engine whose model does not hold its parameters between steps (ZeRO stage 3 frees
  // them unit by unit): calls fn for every parameter of model(), whole, in named_parameters
  // order, gathering one unit at a time (model.pt without the whole model), and returns true.
  // Collective: every rank calls it at the same point. false (fn not called): the model holds
  // its parameters; read them there (after settle()).
  virtual bool visit_parameters(const ParameterVisitor& fn) { return false; }
  // Runs fn while every parameter of model() holds its value (ZeRO stage 3 gathers them all
  // for it, then frees them again: the whole model at once, for what needs it whole, such as
  // a TorchScript module's model.ts). Collective like visit_parameters. Default: fn().
  virtual void with_whole_model(const std::function<void()>& fn) { fn(); }

  // The pieces of the last step that ran alongside the loop's calls (see PhaseSpan), read after
  // reduce_gradients(); empty for an engine that times none. Cheap: only when someone listens.
  virtual std::vector<PhaseSpan> step_spans() const { return {}; }

  // The squared norms of the last step's gradient, this rank's own and the group's average
  // (DataParallel::GradientNorms), once measure_gradient_norms(true) asked for them; none from
  // an engine that does not measure (train/noise_scale.h).
  virtual void measure_gradient_norms(bool on) {}
  virtual std::optional<std::pair<double, double>> gradient_norms() const { return std::nullopt; }

  // Engine-specific fields of the report ("buckets", "compression", ...), merged into it.
  virtual nlohmann::json describe() const = 0;

  // Elastic membership (docs/design/elastic.md §2.3). A step in flight can be abandoned: any
  // call above may throw comm::MembershipChanged (the group of this generation was aborted),
  // PeerLost or Timeout. When can_recover(), the loop then calls recover(cause, steps_ended),
  // which returns once the engine runs on the group of the next generation, holding the last
  // committed step's state; next_step() then hands out the first step not committed, sliced
  // for the new world. recover() returns the change for the report's `membership` (generation,
  // workers, reason, lost, step: the committed steps, lost_steps, detect_seconds, decided_at).
  // Engines with a fixed world cannot recover: the loop lets the error end the run, as before.
  virtual bool can_recover() const { return false; }
  // `steps_ended`: the steps whose end (the shared loss, a checkpoint, an evaluation: the
  // loop's collectives between two steps) this rank ran. A failure can cut that end short on
  // some ranks and not on others; the new group agrees on it in the same exchange that agrees
  // on the committed step, and unended_step() says so to every member, joiners included.
  virtual nlohmann::json recover(const std::string& cause, int64_t steps_ended) { return nullptr; }
  // After a change of generation, once: the committed step whose end some member of the new
  // group did not run (every member runs that end again on the new group, the ones that had
  // run it taking part in its collectives only), or -1. Read by the loop before its next step.
  virtual int64_t unended_step() { return -1; }
  // For the engine an elastic run wraps (elastic/elastic_engine.h), at a change of generation:
  // the group leaves this engine, aborted or about to be, and outlives it (the caller hands it
  // to the reaper once the engine is destroyed: a frozen peer's op may still hold it). From
  // then on the engine only answers model(), state() and apply() — the catch-up of a step the
  // others applied, local on every engine that gives its group up — until it is destroyed.
  // Null (the default, engine.cpp): this engine cannot give its group up (it cannot be wrapped).
  virtual std::unique_ptr<comm::Communicator> take_group();
};

}  // namespace krab::engine
