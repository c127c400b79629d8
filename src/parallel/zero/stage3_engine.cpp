#include "parallel/zero/stage3_engine.h"

#include <torch/torch.h>
#include <unistd.h>

#include "core/errors.h"
#include "models/torchscript.h"
#include "parallel/data_parallel.h"
#include "parallel/zero/plan.h"
#include "parallel/zero/unit_storage.h"

namespace krab::parallel::zero {

namespace {

// The reasons a TorchScript module's children are not units (models/torchscript.h), or that
// the model has no unit calls at all.
std::vector<std::string> gathered_whole(const models::Model& model) {
  if (model.unit_candidates().empty()) return {"(the whole model: it runs no unit calls)"};
  if (const auto* ts = dynamic_cast<const models::TorchScriptModel*>(&model))
    return ts->gathered_whole();
  return {};
}

bool same_layout(const engine::ShardLayout& a, const engine::ShardLayout& b) {
  if (a.num_units() != b.num_units() || a.world() != b.world()) return false;
  for (int u = 0; u < a.num_units(); ++u) {
    const auto &x = a.unit(u), &y = b.unit(u);
    if (x.name != y.name || x.padded != y.padded || x.params.size() != y.params.size())
      return false;
    for (size_t i = 0; i < x.params.size(); ++i)
      if (x.params[i].name != y.params[i].name || x.params[i].shape != y.params[i].shape)
        return false;
  }
  return true;
}

}  // namespace

std::unique_ptr<DiskOffload> open_stage3_offload(const engine::ShardLayout& layout,
                                                 comm::Communicator& comm, const std::string& dir,
                                                 const OptimizerFactory& make_optimizer) {
  if (dir.empty()) return nullptr;
  // The optimizers are made over the masters, which must already be in the file: the job's
  // own optimizer over a stand-in says how many fields each unit's state has.
  const int fields = optimizer_fields(*make_optimizer({torch::zeros({1}).requires_grad_()}));
  std::vector<int64_t> numel;
  for (int u = 0; u < layout.num_units(); ++u) numel.push_back(layout.shard_numel(u));
  return open_offload(dir, comm,
                      plan_offload(numel, std::vector<int>(numel.size(), fields),
                                   ::sysconf(_SC_PAGESIZE), /*master=*/true));
}

int stage3_ward(const Stage3EngineOptions& options, const comm::Communicator& comm) {
  if (!options.replicate_shards) return -1;
  KRAB_CHECK_ARG(options.offload_dir.empty(),
                 "parallel.offload: disk cannot be combined with elastic.replicate_shards (the "
                 "ward masters would stay in RAM)");
  return ward_shard(comm.rank(), comm.size());
}

engine::ShardLayout plan_stage3_layout(const std::vector<engine::ParamShape>& params,
                                       const std::vector<std::string>& candidates,
                                       const Stage3EngineOptions& options, int world) {
  const auto units = candidates.empty() ? plan_units(params, {}, {})
                                        : plan_units(params, candidates,
                                                     options.wrap_auto ? candidates : options.wrap);
  return engine::plan_layout(units, world, options.alignment);
}

Stage3Engine::Stage3Engine(std::shared_ptr<models::Model> model,
                           std::unique_ptr<comm::Communicator> comm, Stage3EngineOptions options,
                           const OptimizerFactory& make_optimizer,
                           std::unique_ptr<Stage3Storage> built)
    : model_(std::move(model)),
      comm_(std::move(comm)),
      options_(std::move(options)),
      steps_(options_.data_parallel.total_steps, options_.data_parallel.global_micro_batch),
      rank_(comm_->rank()) {
  const int ward = stage3_ward(options_, *comm_);
  std::vector<engine::ParamShape> shapes;
  std::vector<at::Tensor> replicated = model_->buffers();  // buffers and frozen parameters
  for (const auto& item : model_->named_parameters()) {
    if (item.value().requires_grad())
      shapes.push_back({item.key(), item.value().sizes().vec()});
    else
      replicated.push_back(item.value());
  }
  KRAB_CHECK_ARG(!shapes.empty(), "parallel.zero_stage: the model has no trainable parameters");
  layout_ = plan_stage3_layout(shapes, model_->unit_candidates(), options_, comm_->size());
  gathered_whole_ = gathered_whole(*model_);
  const auto params = params_by_unit(layout_, *model_);
  if (built) {
    KRAB_CHECK(same_layout(built->layout(), layout_),
               "sharded construction planned other units than the built model has");
    KRAB_CHECK((built->offload() != nullptr) == !options_.offload_dir.empty(),
               "sharded construction: the masters' offload file disagrees with the options");
    KRAB_CHECK(built->ward() == ward,
               "sharded construction: the storage keeps another ward than the options ask");
    storage_ = std::move(built);
  } else {
    storage_ = std::make_unique<Stage3Storage>(
        layout_, comm_->rank(),
        open_stage3_offload(layout_, *comm_, options_.offload_dir, make_optimizer), ward);
    // Unit by unit, so that at most one non-root flat is whole at a time beside the model.
    const bool blank = !options_.broadcast_initial_state;
    for (int u = 1; u < layout_.num_units(); ++u)
      if (blank)
        storage_->adopt_blank(u, params[u], false);
      else
        storage_->adopt(u, params[u], *comm_, false);
    if (blank)
      storage_->adopt_blank(0, params[0], true);
    else
      storage_->adopt(0, params[0], *comm_, true);
  }
  broadcast_from_rank0(*comm_, replicated);

  reducer_ = std::make_unique<GradReducer>(layout_, params, *comm_, /*bucket_bytes=*/0,
                                           /*release_grads=*/true,
                                           compress::make_compressor(options_.compression));
  runner_ = std::make_unique<Stage3Runner>(
      *model_, layout_, *storage_, params, *comm_,
      Stage3RunnerOptions{options_.prefetch, options_.activation_checkpointing});
  std::vector<at::Tensor> masters;
  for (int u = 0; u < layout_.num_units(); ++u) masters.push_back(storage_->master(u));
  optimizers_ = std::make_unique<ShardOptimizers>(masters, make_optimizer);
  if (DiskOffload* offload = storage_->offload()) offload->install_state(masters, *optimizers_);
  if (ward >= 0) {
    std::vector<at::Tensor> wards;
    for (int u = 0; u < layout_.num_units(); ++u) wards.push_back(storage_->ward_master(u));
    buddy_ = std::make_unique<ShardBuddy>(layout_, 3, comm_->rank(), std::move(wards),
                                          /*values_owned=*/true, make_optimizer);
  }
  sharded_.layout = &layout_;
  sharded_.stage = 3;
  sharded_.values = masters;
  sharded_.optimizers = optimizers_->pointers();
}

Stage3Engine::~Stage3Engine() = default;

void Stage3Engine::before_backward(int64_t micro, bool last) {
  // The root is read from the first forward on: its gather (after_step) must have landed.
  storage_->wait(0);
  // Every micro-batch reduces: the previous one's buckets end before this backward refills them.
  if (micro > 0) {
    reducer_->finish();
    runner_->finish_backward();
  }
  reducer_->set_sync(true);
}

void Stage3Engine::reduce_gradients() {
  reducer_->finish();
  runner_->finish_backward();
  // Before the elastic commit vote: a rank votes only once its ward's gradient is here too.
  if (buddy_) {
    std::vector<at::Tensor> grads;
    for (int u = 0; u < layout_.num_units(); ++u) grads.push_back(reducer_->grad_shard(u));
    buddy_->exchange(*comm_, grads);
  }
}

void Stage3Engine::apply(double lr) {
  for (int u = 0; u < layout_.num_units(); ++u)
    storage_->master(u).mutable_grad() = reducer_->grad_shard(u);
  if (DiskOffload* offload = storage_->offload())
    offload->step(*optimizers_, lr);
  else
    optimizers_->step(lr);
  if (buddy_) buddy_->step(lr);
  for (int u = 0; u < layout_.num_units(); ++u) storage_->master(u).mutable_grad() = at::Tensor();
  reducer_->release_shards();
}

void Stage3Engine::after_step(const engine::StepPlan& plan) {
  storage_->refresh(0, *comm_);
  if (options_.data_parallel.broadcast_buffers) broadcast_from_rank0(*comm_, model_->buffers());
}

void Stage3Engine::settle() {
  storage_->wait_all();
  // A forward without its backward (none in training) would leave its last unit gathered.
  runner_->finish_backward();
}

engine::TrainState Stage3Engine::state() {
  // The layout's world, not the group's: after take_group() the state of the generation that
  // ended is still handed out.
  engine::TrainState s{model_.get(), nullptr, rank_, layout_.world(), &sharded_};
  if (buddy_) {
    s.ward = &buddy_->state();
    s.ward_shard = buddy_->ward();
  }
  return s;
}

void Stage3Engine::after_restore() {
  // The restore wrote every master and optimizer field through the mapping.
  if (const DiskOffload* offload = storage_->offload()) offload->release_all();
  storage_->refresh(0, *comm_);
  storage_->wait(0);
  // The restore wrote the own masters; the ward's come from its owner (buddy.h).
  if (buddy_) buddy_->resync(*comm_, sharded_);
}

bool Stage3Engine::visit_parameters(const engine::ParameterVisitor& fn) {
  settle();
  int open = -1;  // the non-root unit gathered for the visit
  for (const auto& item : model_->named_parameters()) {
    const auto loc = layout_.locate(item.key());
    const int u = loc ? loc->unit : 0;
    if (u != 0 && u != open) {
      if (open > 0) storage_->free(open);
      runner_->gather_now(u);
      open = u;
    }
    fn(item.key(), item.value());
  }
  if (open > 0) storage_->free(open);
  return true;
}

void Stage3Engine::with_whole_model(const std::function<void()>& fn) {
  settle();
  for (int u = 1; u < layout_.num_units(); ++u) storage_->start_gather(u, *comm_);
  storage_->wait_all();
  struct FreeAfter {
    Stage3Runner& runner;
    ~FreeAfter() { runner.finish_backward(); }
  } free_after{*runner_};
  fn();
}

engine::MemoryStats Stage3Engine::memory() const {
  engine::MemoryStats m;
  m.known = true;
  const DiskOffload* offload = storage_->offload();
  const int64_t masters = storage_->master_bytes();
  m.grads = masters;  // the grad shards: one per master, alive from the reduce to the step
  m.offloaded = offload ? offload->regions().state_bytes() : 0;
  m.params = offload ? 0 : masters;
  m.optimizer = optimizers_->state_bytes() - (offload ? m.offloaded - masters : 0);
  m.working_set_peak = storage_->held_peak_bytes() + reducer_->peak_bucket_bytes();
  if (buddy_) {
    const WardBytes w = buddy_->bytes();
    m.params += w.values;
    m.grads += w.grads;
    m.optimizer += w.optimizer;
  }
  return m;
}

nlohmann::json Stage3Engine::describe() const {
  nlohmann::json units = nlohmann::json::array();
  for (const auto& u : layout_.units()) units.push_back(u.name);
  return {{"backend", comm_->backend()},
          {"buckets", reducer_->plan().buckets.size()},
          {"compression", reducer_->compression()},
          {"zero",
           {{"stage", 3},
            {"units", units},
            {"alignment", layout_.alignment()},
            {"prefetch", options_.prefetch},
            {"offload", storage_->offload() ? "disk" : "none"},
            {"replicate_shards", buddy_ != nullptr},
            {"activation_checkpointing", options_.activation_checkpointing},
            {"gathered_whole", gathered_whole_}}}};
}

}  // namespace krab::parallel::zero
