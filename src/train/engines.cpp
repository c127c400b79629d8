#include "train/engines.h"

#include <torch/torch.h>
#include <unistd.h>

#include "comm/store.h"
#include "compress/options.h"
#include "core/errors.h"
#include "core/fs.h"
#include "elastic/elastic_engine.h"
#include "elastic/etcd_client.h"
#include "elastic/etcd_rendezvous.h"
#include "elastic/etcd_store.h"
#include "elastic/slices.h"
#include "parallel/compression_hook.h"
#include "parallel/dp_engine.h"
#include "parallel/zero/offload.h"
#include "parallel/zero/plan.h"
#include "parallel/zero/stage3_build.h"
#include "parallel/zero/zero_engine.h"
#include "sync/local_sgd.h"
#include "sync/ps_worker.h"
#include "train/checkpoint.h"
#include "train/job.h"
#include "train/live_reshard.h"
#include "train/peer_state.h"

namespace krab::train {
namespace {

std::chrono::milliseconds comm_timeout(const core::Config& c) {
  return std::chrono::milliseconds(static_cast<int64_t>(c.get_float("comm.timeout_s") * 1000));
}

comm::Options comm_options(const core::Config& c) {
  comm::Options copts;
  copts.timeout = comm_timeout(c);
  copts.debug_checks = c.get_bool("comm.debug_checks");
  // An elastic group fails its waits when the keeper aborts it, and skips the diagnosis (the
  // keeper names the lost rank): comm/communicator.h, Options::abortable.
  copts.abortable = c.get_bool("elastic.enabled");
  if (copts.abortable)
    copts.heartbeat = std::chrono::milliseconds(c.get_int("elastic.heartbeat_ms"));
  return copts;
}

std::unique_ptr<comm::Communicator> connect_group(const core::Config& c,
                                                  const comm::WorldInfo& world) {
  const comm::Options copts = comm_options(c);
  std::unique_ptr<comm::Communicator> comm;
  try {
    comm = comm::make_communicator(c.get_string("comm.backend"), world, copts);
  } catch (const Timeout& e) {
    // The comm layer names the ranks; the user also needs the address and the knob.
    throw Timeout(str_cat(e.what(), " (rendezvous ", world.rendezvous.to_string(),
                          ", comm.timeout_s = ", c.get_float("comm.timeout_s"), " s)"));
  }
  KRAB_CHECK(comm->size() == world.size, "communicator size ", comm->size(), " != world ",
             world.size);
  return comm;
}

std::unique_ptr<engine::Engine> make_ps_worker(const core::Config& c, const TrainOptions& o,
                                               const comm::WorldInfo& world,
                                               std::shared_ptr<models::Model> model) {
  const int servers = static_cast<int>(c.get_int("sync.servers"));
  auto store = comm::connect_store(world.rendezvous, comm_timeout(c));
  std::vector<std::string> addresses;
  for (int i = 0; i < servers; ++i) {
    const auto v = store->get(str_cat("krab/ps/", i));  // waits for the server to publish
    addresses.emplace_back(v.begin(), v.end());
  }
  std::vector<std::string> mirrors;  // sync.replicas: 1 (train/async.cpp publishes them)
  if (c.get_int("sync.replicas") > 0)
    for (int i = 0; i < servers; ++i) {
      const auto v = store->get(str_cat("krab/ps/", i, "/mirror"));
      mirrors.emplace_back(v.begin(), v.end());
    }
  auto client = std::make_unique<sync::PsClient>(addresses, world.rank,
                                                 models::parameter_count(*model), comm_timeout(c),
                                                 world.rendezvous.secret, std::move(mirrors));
  return std::make_unique<sync::PsWorkerEngine>(std::move(model), std::move(client), world.rank,
                                                world.size, o.batch * world.size);
}

// Shards of whole codec chunks (design §1.2, parallel/zero/plan.h), as memory_plan predicts.
int64_t zero_alignment(const core::Config& c) {
  const std::string& codec = c.get_string("comm.compression");
  const int64_t chunk = c.get_int("comm.chunk");
  return parallel::zero::shard_alignment(
      codec == "int8" || codec == "onebit" ? (chunk > 0 ? chunk : 256) : 1);
}

// Stage 3's units are the model's unit calls: `auto` takes every one of them. Its workers keep
// krab's heap settings (cli/main.cpp), as every other engine's do: the unit flats, allocated
// and freed twice a step, come from Stage3Storage's own pool of mappings
// (parallel/zero/flat_pool.h), so they neither strand holes in the heap nor fault in fresh
// pages on every gather.
parallel::zero::Stage3EngineOptions stage3_options(const core::Config& c, const TrainOptions& o,
                                                   const parallel::DataParallelEngineOptions& dpo) {
  parallel::zero::Stage3EngineOptions so;
  const std::string wrap = c.get_string("parallel.wrap");
  so.wrap_auto = wrap == "auto";
  if (!so.wrap_auto) so.wrap = parallel::zero::wrap_globs(wrap);
  so.prefetch = static_cast<int>(c.get_int("parallel.prefetch"));
  so.activation_checkpointing = o.activation_checkpointing;
  so.compression = compress::CompressionOptions::from_config(c);
  so.data_parallel = dpo;
  if (c.get_string("parallel.offload") == "disk") so.offload_dir = run_directory(c) + "/offload";
  return so;
}

std::unique_ptr<engine::Engine> make_stage3_engine(const core::Config& c, const TrainOptions& o,
                                                   std::unique_ptr<comm::Communicator> group,
                                                   const models::ModelSpec& spec,
                                                   const parallel::DataParallelEngineOptions& dpo) {
  return parallel::zero::make_stage3_engine(
      spec, std::move(group), stage3_options(c, o, dpo),
      [&c](std::vector<at::Tensor> params) { return make_optimizer(c, std::move(params)); });
}

}  // namespace

void check_compression_options(const core::Config& job) {
  compress::CompressionOptions::from_config(job);
}

namespace {

// parallel.balance: auto — the pure planner of elastic/slices.h, run by every rank on the same
// all-reduced times (parallel/steps.h); its history of earlier windows (what the step-time fit
// needs) travels through the steps' SliceMemory.
parallel::SliceBalance slice_balance(const core::Config& c) {
  if (c.get_string("parallel.balance") == "off") return {};
  const double max_change = c.get_float("parallel.balance_max_change");
  return {c.get_int("parallel.balance_every"),
          [max_change](const std::vector<int64_t>& sizes, const std::vector<int64_t>& us,
                       const parallel::SliceMemory& memory) {
            elastic::Rebalance next =
                elastic::rebalance(sizes, us, max_change, {memory.sizes, memory.compute_us});
            return parallel::SlicePlan{
                std::move(next.sizes),
                {std::move(next.history.sizes), std::move(next.history.compute_us)}};
          }};
}

// parallel.zero_stage 1 or 2 (zero_engine.h), from the job.
parallel::zero::ZeroEngineOptions zero_options(const core::Config& c, const TrainOptions& o,
                                               const parallel::DataParallelEngineOptions& dpo) {
  parallel::zero::ZeroEngineOptions zo;
  zo.stage = o.zero_stage;
  zo.wrap = c.get_string("parallel.wrap");
  zo.activation_checkpointing = o.activation_checkpointing;
  zo.data_parallel = dpo;
  zo.compression = compress::CompressionOptions::from_config(c);
  zo.alignment = zero_alignment(c);
  if (c.get_string("parallel.offload") == "disk") zo.offload_dir = run_directory(c) + "/offload";
  return zo;
}

// Generation g's data-parallel engine: the first broadcasts rank 0's state, the later ones
// adopt the previous generation's optimizer, and rank 0's replica reaches the joiners as a
// resume would read it (the same checks of model, signature and global batch:
// train/peer_state.h).
elastic::InnerEngineFactory data_parallel_generations(
    const core::Config& c, std::shared_ptr<models::Model> model,
    const parallel::DataParallelEngineOptions& dpo, const CheckpointMeta& meta) {
  return
      [&c, model, dpo, meta](std::unique_ptr<comm::Communicator> g,
                             const elastic::InnerEntry& entry) -> std::unique_ptr<engine::Engine> {
        parallel::DataParallelEngineOptions options = dpo;
        options.data_parallel.broadcast_initial_state = entry.initial;
        std::unique_ptr<torch::optim::Optimizer> adopted;
        if (entry.previous != nullptr)
          adopted = dynamic_cast<parallel::DataParallelEngine&>(*entry.previous).take_optimizer();
        auto e = std::make_unique<parallel::DataParallelEngine>(
            model, std::move(g), options,
            parallel::make_compression_hook(compress::CompressionOptions::from_config(c)),
            [&c](std::vector<at::Tensor> params) { return make_optimizer(c, std::move(params)); },
            std::move(adopted));
        if (entry.initial) return e;
        if (entry.joiners) {
          CheckpointMeta m = meta;
          m.step = entry.step;
          m.signature = model_signature(*model);
          transfer_replica(*e->group(), e->state(), m, entry.joining);
        }
        e->broadcast_buffers();  // an aborted generation's broadcast may have reached only some
        return e;
      };
}

// Fills the new sharded engine `e` with the committed step from the previous generation's
// shards (or, for a joiner, from the others' alone), then gathers and re-copies the wards.
void reshard_into(engine::Engine& e, const elastic::InnerEntry& entry, const CheckpointMeta& meta,
                  const std::function<engine::ShardLayout(int)>& layout_for) {
  engine::TrainState before;
  if (entry.previous != nullptr) before = entry.previous->state();
  CheckpointMeta m = meta;
  m.step = entry.step;
  m.signature = model_signature(e.model());
  reshard_live(*e.group(), entry.previous != nullptr ? &before : nullptr, e.state(), layout_for, m);
  e.after_restore();
}

// Generation g's ZeRO stage 1-2 engine: the first broadcasts rank 0's state; a later one is
// built on the model as it stands and gets the committed shards from the previous
// generation's holders (train/live_reshard.h), then gathers them into the parameters and
// re-copies the wards (after_restore), as a resume from a sharded checkpoint does.
elastic::InnerEngineFactory zero_generations(const core::Config& c, const TrainOptions& o,
                                             std::shared_ptr<models::Model> model,
                                             const parallel::DataParallelEngineOptions& dpo,
                                             const CheckpointMeta& meta) {
  parallel::zero::ZeroEngineOptions zo = zero_options(c, o, dpo);
  zo.replicate_shards = c.get_bool("elastic.replicate_shards");
  return [&c, model, zo, meta](
             std::unique_ptr<comm::Communicator> g,
             const elastic::InnerEntry& entry) -> std::unique_ptr<engine::Engine> {
    parallel::zero::ZeroEngineOptions options = zo;
    options.broadcast_initial_state = entry.initial;
    const parallel::OptimizerFactory optimizer = [&c](std::vector<at::Tensor> params) {
      return make_optimizer(c, std::move(params));
    };
    auto e = std::make_unique<parallel::zero::ZeroEngine>(model, std::move(g), options, optimizer);
    if (entry.initial) return e;
    reshard_into(*e, entry, meta, [&e, &options](int world) {
      return parallel::zero::plan_zero_layout(e->model(), options.wrap, world, options.alignment);
    });
    return e;
  };
}

// Generation g's ZeRO stage 3 engine: the first is built as without elastic (sharded
// construction: no rank holds the whole model); a later one on the same model with its units
// adopted blank, its masters filled from the previous generation's (train/live_reshard.h). A
// joiner builds the model whole once (its units are then adopted blank and freed).
elastic::InnerEngineFactory stage3_generations(const core::Config& c, const TrainOptions& o,
                                               const models::ModelSpec& spec,
                                               const parallel::DataParallelEngineOptions& dpo,
                                               const CheckpointMeta& meta) {
  parallel::zero::Stage3EngineOptions so = stage3_options(c, o, dpo);
  so.replicate_shards = c.get_bool("elastic.replicate_shards");
  auto model = std::make_shared<std::shared_ptr<models::Model>>();
  return [&c, spec, so, meta, model](
             std::unique_ptr<comm::Communicator> g,
             const elastic::InnerEntry& entry) -> std::unique_ptr<engine::Engine> {
    const parallel::OptimizerFactory optimizer = [&c](std::vector<at::Tensor> params) {
      return make_optimizer(c, std::move(params));
    };
    if (entry.initial) {
      auto e = parallel::zero::make_stage3_engine(spec, std::move(g), so, optimizer);
      *model = e->shared_model();
      return e;
    }
    if (*model == nullptr) *model = models::make_model(spec);  // a joiner
    parallel::zero::Stage3EngineOptions options = so;
    options.broadcast_initial_state = false;
    auto e =
        std::make_unique<parallel::zero::Stage3Engine>(*model, std::move(g), options, optimizer);
    reshard_into(*e, entry, meta, [&e, &options](int world) {
      std::vector<engine::ParamShape> shapes;
      for (const auto& item : e->model().named_parameters())
        if (item.value().requires_grad())
          shapes.push_back({item.key(), item.value().sizes().vec()});
      return parallel::zero::plan_stage3_layout(shapes, e->model().unit_candidates(), options,
                                                world);
    });
    return e;
  };
}

// Training on a changing membership: every generation's inner engine is built on the same
// model by the factory of the job's engine (elastic/elastic_engine.h).
std::unique_ptr<engine::Engine> make_elastic_engine(const core::Config& c, const TrainOptions& o,
                                                    const comm::WorldInfo& world,
                                                    const models::ModelSpec& spec,
                                                    const parallel::DataParallelEngineOptions& dpo,
                                                    const ElasticPlace& place) {
  KRAB_CHECK_ARG(!place.member.empty(),
                 "elastic.enabled needs krab's own launcher (`krab train JOB.yaml`): it keeps the "
                 "membership; under torchrun, mpirun or Slurm the world is fixed");
  elastic::ElasticEngineOptions eo;
  eo.self = elastic::MemberId::parse(place.member);
  if (place.etcd_endpoints.empty()) {
    eo.control = comm::reconnecting_store(world.rendezvous, comm_timeout(c));
  } else {
    elastic::EtcdClient::Options etcd;
    etcd.endpoints = elastic::EtcdClient::parse_endpoints(place.etcd_endpoints, "--rdzv-endpoints");
    etcd.timeout = comm_timeout(c);
    eo.control = c10::make_intrusive<elastic::EtcdStore>(
        std::make_shared<elastic::EtcdClient>(etcd),
        elastic::etcd_run_prefix(world.rendezvous.secret, place.etcd_run), comm_timeout(c));
  }
  eo.backend = c.get_string("comm.backend");
  eo.comm = comm_options(c);
  eo.secret = world.rendezvous.secret;
  eo.iface = world.iface;
  eo.wait_s = c.get_float("elastic.wait_s");
  eo.leave_requested = elastic::leave_on_sigterm();
  const CheckpointMeta meta{0, c.get_string("model.name"), "",
                            dpo.global_micro_batch * o.micro_batches, o.seed};
  auto group = place.joining ? nullptr : connect_group(c, world);
  elastic::InnerEngineFactory inner;
  if (o.zero_stage == 3)
    inner = stage3_generations(c, o, spec, dpo, meta);
  else if (o.zero_stage > 0)
    inner = zero_generations(c, o, models::make_model(spec), dpo, meta);
  else
    inner = data_parallel_generations(c, models::make_model(spec), dpo, meta);
  return std::make_unique<elastic::ElasticEngine>(eo, std::move(inner), std::move(group),
                                                  world.generation);
}

}  // namespace

std::unique_ptr<engine::Engine> make_engine(const core::Config& c, const TrainOptions& o,
                                            const comm::WorldInfo& world,
                                            const models::ModelSpec& spec, int64_t total_steps,
                                            const ElasticPlace& place) {
  if (o.sync_mode == SyncMode::kAsync) return make_ps_worker(c, o, world, models::make_model(spec));
  parallel::DataParallelEngineOptions dpo;
  dpo.total_steps = total_steps;
  dpo.global_micro_batch = o.batch * world.size;
  dpo.data_parallel.bucket_mb = c.get_float("parallel.bucket_mb");
  dpo.broadcast_buffers = c.get_bool("parallel.broadcast_buffers");
  dpo.balance = slice_balance(c);
  if (c.get_bool("elastic.enabled")) return make_elastic_engine(c, o, world, spec, dpo, place);
  auto group = connect_group(c, world);
  if (o.zero_stage == 3) return make_stage3_engine(c, o, std::move(group), spec, dpo);
  auto model = models::make_model(spec);
  auto hook = parallel::make_compression_hook(compress::CompressionOptions::from_config(c));
  const parallel::OptimizerFactory optimizer = [&c](std::vector<at::Tensor> params) {
    return make_optimizer(c, std::move(params));
  };
  if (o.zero_stage > 0)  // options.cpp allows it with sync.mode: sync only
    return std::make_unique<parallel::zero::ZeroEngine>(std::move(model), std::move(group),
                                                        zero_options(c, o, dpo), optimizer);
  if (o.sync_mode == SyncMode::kLocalSgd)
    return std::make_unique<sync::LocalSgdEngine>(
        std::move(model), std::move(group), dpo, std::move(hook), optimizer,
        sync::LocalSgdOptions{o.local_sgd_period, o.local_sgd_warmup});
  return std::make_unique<parallel::DataParallelEngine>(std::move(model), std::move(group), dpo,
                                                        std::move(hook), optimizer);
}

// The engine checks again when it starts (parallel/zero/zero_engine.h), with the layout it
// built; here the same layout is planned from the parameters' shapes so that nothing is spawned
// and no model is built (a model larger than one worker must not be built in the launcher).
void check_offload_room(const core::Config& job, const std::vector<engine::ParamShape>& shapes,
                        const std::vector<std::string>& unit_candidates, int workers) {
  if (job.get_string("parallel.offload") != "disk") return;
  namespace zero = parallel::zero;
  if (shapes.empty()) return;  // the engine refuses such a model by name
  const auto layout =
      engine::plan_layout(zero::plan_wrap(shapes, unit_candidates, job.get_string("parallel.wrap")),
                          workers, zero_alignment(job));
  // The job's own optimizer over a stand-in tensor says how many fields each shard's state has.
  const auto probe = make_optimizer(job, {torch::zeros({1}).requires_grad_()});
  const int fields = zero::optimizer_fields(*probe);
  std::vector<int64_t> numel;
  for (int u = 0; u < layout.num_units(); ++u) numel.push_back(layout.shard_numel(u));
  // Stage 3 keeps its master shards in the file too, one more field per unit.
  const auto regions =
      zero::plan_offload(numel, std::vector<int>(numel.size(), fields), ::sysconf(_SC_PAGESIZE),
                         /*master=*/job.get_int("parallel.zero_stage") == 3);
  const std::string dir = run_directory(job) + "/offload";
  core::check_writable_dir(dir, "parallel.offload");
  zero::check_offload_room(dir, workers, regions.file_bytes, zero::available_bytes(dir));
}

}  // namespace krab::train
