#include "train/engines.h"

#include <torch/torch.h>

#include "comm/store.h"
#include "compress/hooks.h"
#include "core/errors.h"
#include "parallel/dp_engine.h"
#include "sync/local_sgd.h"
#include "sync/ps_worker.h"
#include "train/job.h"

namespace krab::train {
namespace {

std::chrono::milliseconds comm_timeout(const core::Config& c) {
  return std::chrono::milliseconds(static_cast<int64_t>(c.get_float("comm.timeout_s") * 1000));
}

compress::CompressionOptions compression_options(const core::Config& c) {
  compress::CompressionOptions o;
  o.name = c.get_string("comm.compression");
  o.ratio = c.get_float("comm.ratio");
  o.rank = c.get_int("comm.rank");
  o.chunk = c.get_int("comm.chunk");
  // The key's default (hadamard) is onebit's; other compressors take it only when it is named.
  o.rotation = o.name == "onebit" || c.is_set("comm.rotation") ? c.get_string("comm.rotation")
                                                               : "none";
  o.error_feedback = c.get_bool("comm.error_feedback");
  o.warmup_steps = c.get_int("comm.compress_warmup_steps");
  o.min_numel = c.get_int("comm.compress_min_numel");
  o.momentum = c.get_float("comm.momentum_correction");
  o.clip_norm = c.get_float("comm.clip_norm");
  o.seed = static_cast<uint64_t>(c.get_int("train.seed"));
  compress::validate(o);
  KRAB_CHECK_ARG(o.name == "none" || c.get_string("sync.mode") == "sync", "comm.compression '",
                 o.name, "' compresses the gradients of sync.mode 'sync'; sync.mode '",
                 c.get_string("sync.mode"), "' does not average gradients");
  KRAB_CHECK_ARG(!c.is_set("comm.fold_momentum") || !c.get_bool("comm.fold_momentum") ||
                     o.name == "randomk",
                 "comm.fold_momentum: true is for comm.compression 'randomk' (whose error feedback "
                 "acts as momentum), not '", o.name, "'");
  if (o.momentum > 0 && c.get_string("train.optimizer.name") == "sgd")
    KRAB_CHECK_ARG(c.get_float("train.optimizer.momentum") == 0,
                   "comm.momentum_correction ", o.momentum, " with train.optimizer.momentum ",
                   c.get_float("train.optimizer.momentum"),
                   " would apply momentum twice; set train.optimizer.momentum: 0");
  return o;
}

std::unique_ptr<comm::Communicator> connect_group(const core::Config& c,
                                                  const comm::WorldInfo& world) {
  comm::Options copts;
  copts.timeout = comm_timeout(c);
  copts.debug_checks = c.get_bool("comm.debug_checks");
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
  auto client = std::make_unique<sync::PsClient>(
      addresses, world.rank, models::parameter_count(*model), comm_timeout(c),
      world.rendezvous.secret);
  return std::make_unique<sync::PsWorkerEngine>(std::move(model), std::move(client), world.rank,
                                                world.size, o.batch * world.size);
}

}  // namespace

void check_compression_options(const core::Config& job) { compression_options(job); }

std::unique_ptr<engine::Engine> make_engine(const core::Config& c, const TrainOptions& o,
                                            const comm::WorldInfo& world,
                                            std::shared_ptr<models::Model> model,
                                            int64_t total_steps) {
  if (o.sync_mode == SyncMode::kAsync) return make_ps_worker(c, o, world, std::move(model));
  parallel::DataParallelEngineOptions dpo;
  dpo.total_steps = total_steps;
  dpo.global_micro_batch = o.batch * world.size;
  dpo.data_parallel.bucket_mb = c.get_float("parallel.bucket_mb");
  auto group = connect_group(c, world);
  auto hook = compress::make_compression_hook(compression_options(c));
  const parallel::OptimizerFactory optimizer = [&c](std::vector<at::Tensor> params) {
    return make_optimizer(c, std::move(params));
  };
  if (o.sync_mode == SyncMode::kLocalSgd)
    return std::make_unique<sync::LocalSgdEngine>(
        std::move(model), std::move(group), dpo, std::move(hook), optimizer,
        sync::LocalSgdOptions{o.local_sgd_period, o.local_sgd_warmup});
  return std::make_unique<parallel::DataParallelEngine>(std::move(model), std::move(group), dpo,
                                                        std::move(hook), optimizer);
}

}  // namespace krab::train
