#include "parallel/zero/zero_engine.h"

#include <torch/torch.h>
#include <unistd.h>

#include "core/errors.h"
#include "parallel/data_parallel.h"
#include "parallel/zero/plan.h"

namespace krab::parallel::zero {

engine::ShardLayout plan_zero_layout(models::Model& model, const std::string& wrap, int world,
                                     int64_t alignment) {
  std::vector<engine::ParamShape> shapes;
  for (const auto& item : model.named_parameters())
    if (item.value().requires_grad()) shapes.push_back({item.key(), item.value().sizes().vec()});
  KRAB_CHECK_ARG(!shapes.empty(), "parallel.zero_stage: the model has no trainable parameters");
  return engine::plan_layout(plan_wrap(shapes, model.unit_candidates(), wrap), world, alignment);
}

ZeroEngine::ZeroEngine(std::shared_ptr<models::Model> model,
                       std::unique_ptr<comm::Communicator> comm, ZeroEngineOptions options,
                       const OptimizerFactory& make_optimizer)
    : model_(std::move(model)),
      comm_(std::move(comm)),
      options_(std::move(options)),
      steps_(options_.data_parallel.total_steps, options_.data_parallel.global_micro_batch,
             options_.data_parallel.balance),
      rank_(comm_->rank()) {
  KRAB_CHECK_ARG(options_.stage == 1 || options_.stage == 2,
                 "parallel.zero_stage: ZeroEngine runs stages 1 and 2, got ", options_.stage);
  KRAB_CHECK_ARG(!options_.replicate_shards || options_.offload_dir.empty(),
                 "parallel.offload: disk cannot be combined with elastic.replicate_shards (the "
                 "ward's optimizer state would stay in RAM)");
  // Every replica starts from rank 0's values, as with the data-parallel engine.
  std::vector<at::Tensor> state;
  for (const auto& p : model_->parameters())
    if (options_.broadcast_initial_state || !p.requires_grad()) state.push_back(p);
  for (auto& b : model_->buffers()) state.push_back(b);
  broadcast_from_rank0(*comm_, state);

  for (const auto& p : model_->parameters())
    if (p.requires_grad()) trainable_.push_back(p);
  layout_ = plan_zero_layout(*model_, options_.wrap, comm_->size(), options_.alignment);
  wrap_source_ = wrap_source(model_->unit_candidates(), options_.wrap);
  const auto params = params_by_unit(layout_, *model_);
  storage_ = std::make_unique<UnitStorage>(layout_, params, comm_->rank());
  const auto cap =
      static_cast<int64_t>(options_.data_parallel.data_parallel.bucket_mb * 1024 * 1024);
  reducer_ = std::make_unique<GradReducer>(layout_, params, *comm_, cap, options_.stage == 2,
                                           compress::make_compressor(options_.compression));
  std::vector<at::Tensor> shards;
  for (int u = 0; u < layout_.num_units(); ++u) shards.push_back(storage_->shard(u));
  optimizers_ = std::make_unique<ShardOptimizers>(shards, make_optimizer);
  if (!options_.offload_dir.empty()) start_offload(shards);
  if (options_.replicate_shards && comm_->size() > 1) start_buddy(make_optimizer);
  sharded_.layout = &layout_;
  sharded_.stage = options_.stage;
  sharded_.values = shards;
  sharded_.optimizers = optimizers_->pointers();
  install_gather_wait();
}

ZeroEngine::~ZeroEngine() {
  if (gather_wait_) gather_wait_->uninstall(*model_);
}

// Stages 1-2 hold every parameter between steps; only the gathers after a step are waited
// late, unit by unit, in the forward (gather_wait_runner.h). A model without candidates gets no
// runner: its plan waits every unit before the forward. With activation checkpointing the
// runner also recomputes, since the model has room for one runner.
void ZeroEngine::install_gather_wait() {
  const std::vector<std::string> candidates = model_->unit_candidates();
  waits_ = plan_gather_waits(layout_, candidates);
  if (candidates.empty() || options_.stage > 2) return;  // stage 3 gathers in its own runner
  std::unique_ptr<models::RecomputeRunner> recompute;
  if (options_.activation_checkpointing)
    recompute = std::make_unique<models::RecomputeRunner>(*model_);
  gather_wait_ = std::make_unique<GatherWaitRunner>(*storage_, waits_, std::move(recompute));
  gather_wait_->install(*model_);
}

// The ward's values are its chunk of every flat: every rank holds all parameters, and the
// initial broadcast made them the owner's.
void ZeroEngine::start_buddy(const OptimizerFactory& make_optimizer) {
  const int ward = ward_shard(comm_->rank(), comm_->size());
  std::vector<at::Tensor> values;
  for (int u = 0; u < layout_.num_units(); ++u) {
    const engine::Range r = layout_.shard(u, ward);
    values.push_back(storage_->flat(u).narrow(0, r.begin, r.size()));
  }
  buddy_ = std::make_unique<ShardBuddy>(layout_, options_.stage, comm_->rank(), std::move(values),
                                        /*values_owned=*/false, make_optimizer);
}

// The room for every rank's file is agreed on before any is allocated (open_offload).
void ZeroEngine::start_offload(const std::vector<at::Tensor>& shards) {
  std::vector<int64_t> numel;
  std::vector<int> fields;
  for (int u = 0; u < layout_.num_units(); ++u) {
    numel.push_back(layout_.shard_numel(u));
    fields.push_back(optimizer_fields(optimizers_->at(u)));
  }
  offload_ = open_offload(options_.offload_dir, *comm_,
                          plan_offload(numel, fields, ::sysconf(_SC_PAGESIZE)));
  offload_->install_state(shards, *optimizers_);
}

void ZeroEngine::before_backward(int64_t micro, bool last) {
  // The forward reads these units outside any unit (gpt's embeddings): their gathers must
  // have landed. The runner waits every other unit right before it runs.
  for (int u : waits_.before_forward) storage_->wait(u);
  // Stage 2 reduces every micro-batch: the previous one's buckets end before this backward
  // refills them.
  if (options_.stage == 2 && micro > 0) reducer_->finish();
  reducer_->set_sync(options_.stage == 2 || last);
}

void ZeroEngine::reduce_gradients() {
  reducer_->finish();
  // Before the elastic commit vote: a rank votes only once its ward's gradient is here too.
  if (buddy_) {
    std::vector<at::Tensor> grads;
    for (int u = 0; u < layout_.num_units(); ++u) grads.push_back(reducer_->grad_shard(u));
    buddy_->exchange(*comm_, grads);
  }
}

void ZeroEngine::apply(double lr) {
  // The step writes the shards, which are parts of the flats: no gather may still write them
  // (one would be pending only for a unit the forward never ran).
  storage_->wait();
  for (int u = 0; u < layout_.num_units(); ++u)
    storage_->shard(u).mutable_grad() = reducer_->grad_shard(u);
  if (offload_)
    offload_->step(*optimizers_, lr);
  else
    optimizers_->step(lr);
  // The ward's chunk is stepped in the flat too; the next all-gather rewrites it with the
  // owner's bits, which are the same (buddy.h).
  if (buddy_) buddy_->step(lr);
  for (int u = 0; u < layout_.num_units(); ++u) storage_->shard(u).mutable_grad() = at::Tensor();
  reducer_->release_shards();
  // Undefined rather than zero: the next backward's accumulation starts from nothing either
  // way (0 + g = g), and stage 1 holds no full gradient between steps.
  for (auto& p : trainable_) p.mutable_grad() = at::Tensor();
}

void ZeroEngine::after_step(const engine::StepPlan& plan) {
  // The buffer broadcast blocks: issued before the gathers it does not wait behind them.
  if (options_.data_parallel.broadcast_buffers) broadcast_from_rank0(*comm_, model_->buffers());
  storage_->start_gather(*comm_, waits_.order);
}

engine::TrainState ZeroEngine::state() {
  // The layout's world and the shard this rank owns, not the group's: after take_group() the
  // state of the generation that ended is still handed out.
  engine::TrainState s{model_.get(), nullptr, rank_, layout_.world(), &sharded_};
  if (buddy_) {
    s.ward = &buddy_->state();
    s.ward_shard = buddy_->ward();
  }
  return s;
}

void ZeroEngine::after_restore() {
  storage_->start_gather(*comm_);
  storage_->wait();
  // The restore wrote the own shards; the ward's state comes from its owner (buddy.h).
  if (buddy_) buddy_->resync(*comm_, sharded_);
}

engine::MemoryStats ZeroEngine::memory() const {
  engine::MemoryStats m;
  m.known = true;
  m.params = storage_->bytes();
  int64_t shard_bytes = 0;
  for (int u = 0; u < layout_.num_units(); ++u)
    shard_bytes += layout_.shard_numel(u) * static_cast<int64_t>(sizeof(float));
  int64_t full_grads = 0;
  for (const auto& p : trainable_) full_grads += p.numel() * static_cast<int64_t>(sizeof(float));
  // Stage 1 holds every .grad through the backward and the grad shards until the step (working
  // set, as memory_model.h counts them); stage 2 holds the shards.
  m.grads = options_.stage == 1 ? full_grads : shard_bytes;
  const int64_t offloaded = offload_ ? offload_->regions().state_bytes() : 0;
  m.optimizer = optimizers_->state_bytes() - offloaded;
  m.offloaded = offloaded;
  m.working_set_peak = reducer_->peak_bucket_bytes() + (options_.stage == 1 ? shard_bytes : 0);
  if (buddy_) {  // the ward's gradient shards sit where the own ones are counted
    const WardBytes w = buddy_->bytes();
    m.optimizer += w.optimizer;
    (options_.stage == 1 ? m.working_set_peak : m.grads) += w.grads;
  }
  return m;
}

nlohmann::json ZeroEngine::describe() const {
  nlohmann::json units = nlohmann::json::array();
  for (const auto& u : layout_.units()) units.push_back(u.name);
  nlohmann::json out = {
      {"backend", comm_->backend()},
      {"buckets", reducer_->plan().buckets.size()},
      {"compression", reducer_->compression()},
      {"zero",
       {{"stage", options_.stage},
        {"units", units},
        {"wrap", wrap_source_},
        {"gather_wait", gather_wait_ ? "per unit, at its forward" : "all, before the forward"},
        {"recompute", gather_wait_ != nullptr && gather_wait_->recomputes()},
        {"alignment", layout_.alignment()},
        {"offload", offload_ ? "disk" : "none"},
        {"replicate_shards", buddy_ != nullptr},
        {"gathered_whole", nlohmann::json::array()}}}};
  if (auto balance = steps_.describe(); !balance.is_null()) out["balance"] = balance;
  return out;
}

}  // namespace krab::parallel::zero
