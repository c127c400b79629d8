#include "train/options.h"

#include <cstdio>

#include "core/errors.h"

namespace krab::train {

namespace {

SyncMode parse_sync_mode(const std::string& name) {
  if (name == "local_sgd") return SyncMode::kLocalSgd;
  if (name == "async") return SyncMode::kAsync;
  KRAB_CHECK_ARG(name == "sync", "sync.mode '", name, "': expected sync, local_sgd or async");
  return SyncMode::kSync;
}

}  // namespace

const char* sync_mode_name(SyncMode mode) {
  switch (mode) {
    case SyncMode::kLocalSgd:
      return "local_sgd";
    case SyncMode::kAsync:
      return "async";
    case SyncMode::kSync:
      break;
  }
  return "sync";
}

TrainOptions TrainOptions::from_config(const core::Config& c) {
  TrainOptions o;
  o.sync_mode = parse_sync_mode(c.get_string("sync.mode"));
  o.batch = c.get_int("data.batch_size");
  o.micro_batches = c.get_int("train.grad_accum");
  o.seed = c.get_int("train.seed");
  o.threads = static_cast<int>(c.get_int("train.threads_per_worker"));
  o.schedule = parse_schedule(c.get_string("train.lr_schedule"));
  o.base_lr = c.get_float("train.optimizer.lr");
  o.lr_warmup_steps = c.get_int("train.warmup_steps");
  o.checkpoint_every = c.get_int("checkpoint.every_steps");
  o.checkpoint_keep = static_cast<int>(c.get_int("checkpoint.keep"));
  o.resume = c.get_bool("checkpoint.resume");
  o.eval_every = c.get_int("train.eval_every");
  o.eval_examples = c.get_int("train.eval_examples");
  o.log_every = c.get_int("train.log_every");
  o.local_sgd_period = c.get_int("sync.period");
  o.local_sgd_warmup = c.get_int("sync.warmup_steps");
  check_zero_options(c);
  check_balance_options(c);
  o.zero_stage = static_cast<int>(c.get_int("parallel.zero_stage"));
  o.precision = parse_precision(c.get_string("train.precision"));
  o.activation_checkpointing = c.get_bool("model.activation_checkpointing");
  return o;
}

void check_zero_options(const core::Config& c) {
  const int64_t stage = c.get_int("parallel.zero_stage");
  KRAB_CHECK_ARG(stage > 0 || c.get_string("parallel.offload") == "none",
                 "parallel.offload: ", c.get_string("parallel.offload"),
                 " needs parallel.zero_stage 1, 2 or 3 (stage 0 has no shards to offload)");
  if (stage == 0) return;
  const std::string& mode = c.get_string("sync.mode");
  KRAB_CHECK_ARG(mode == "sync", "parallel.zero_stage ", stage, " needs sync.mode: sync, got ",
                 mode,
                 mode == "async" ? " (the parameter servers hold the optimizer state)"
                                 : " (a worker holding 1/N of the optimizer state cannot take "
                                   "local steps on the whole model)");
  // fp16, bf16, int8 and onebit go through the reduce-scatter
  // (parallel/zero/sharded_compression.h); the others cannot split their payload by rank
  // (topk, randomk: sparse positions; powersgd: low-rank factors).
  const std::string& compression = c.get_string("comm.compression");
  KRAB_CHECK_ARG(compression == "none" || compression == "fp16" || compression == "bf16" ||
                     compression == "int8" || compression == "onebit",
                 "parallel.zero_stage ", stage,
                 " cannot be combined with comm.compression: ", compression,
                 " (none, fp16, bf16, int8 and onebit can; or use parallel.zero_stage: 0)");
  // Stage 3's shards are aligned to 16 values, not to whole codec chunks.
  KRAB_CHECK_ARG(stage < 3 || (compression != "int8" && compression != "onebit"),
                 "parallel.zero_stage 3 cannot be combined with comm.compression: ", compression,
                 " yet (none, fp16 and bf16 can; int8 and onebit at stages 1-2)");
  // Both keep a full-size velocity or norm per bucket of full gradients: a stage that drops
  // them (2) cannot, and the sharded reduce-scatter does not apply them at stage 1 yet.
  KRAB_CHECK_ARG(c.get_float("comm.momentum_correction") == 0, "parallel.zero_stage ", stage,
                 " cannot be combined with comm.momentum_correction (a full-size velocity per "
                 "bucket): use parallel.zero_stage: 0");
  KRAB_CHECK_ARG(c.get_float("comm.clip_norm") == 0, "parallel.zero_stage ", stage,
                 " cannot be combined with comm.clip_norm (a norm over each worker's full "
                 "gradient): use parallel.zero_stage: 0");
}

void check_balance_options(const core::Config& c) {
  if (c.get_string("parallel.balance") == "off") return;
  const std::string& mode = c.get_string("sync.mode");
  KRAB_CHECK_ARG(mode == "sync", "parallel.balance: auto needs sync.mode: sync, got ", mode,
                 mode == "async" ? " (the parameter server already hands a fast worker more "
                                   "steps: it asks more often)"
                                 : " (local steps have no per-step average to weight)");
  // Stage 3's forward waits for every rank's all-gathers, so a rank's forward+backward time
  // holds the others' delays and cannot tell who is slow.
  KRAB_CHECK_ARG(c.get_int("parallel.zero_stage") < 3,
                 "parallel.balance: auto cannot be combined with parallel.zero_stage 3 yet (its "
                 "compute time includes the all-gathers' waits for the slowest worker); stages "
                 "0-2 can");
}

ElasticOptions ElasticOptions::from_config(const core::Config& c) {
  ElasticOptions o;
  o.enabled = c.get_bool("elastic.enabled");
  o.min_workers = static_cast<int>(c.get_int("elastic.min_workers"));
  o.max_workers = static_cast<int>(c.get_int("elastic.max_workers"));
  o.wait_s = c.get_float("elastic.wait_s");
  o.heartbeat_ms = c.get_int("elastic.heartbeat_ms");
  o.dead_after_ms = c.get_int("elastic.dead_after_ms");
  o.lease_s = c.get_float("elastic.lease_s");
  o.replace_dead = c.get_bool("elastic.replace_dead");
  o.max_restarts = static_cast<int>(c.get_int("elastic.max_restarts"));
  o.replicate_shards = c.get_bool("elastic.replicate_shards");
  o.autoscale = c.get_string("elastic.autoscale.provider");
  o.up_efficiency = c.get_float("elastic.autoscale.up_efficiency");
  o.down_efficiency = c.get_float("elastic.autoscale.down_efficiency");
  o.window_steps = c.get_int("elastic.autoscale.window_steps");
  o.cooldown_steps = c.get_int("elastic.autoscale.cooldown_steps");
  return o;
}

void check_elastic_options(const core::Config& c, int workers, const std::string& workers_key) {
  const ElasticOptions e = ElasticOptions::from_config(c);
  KRAB_CHECK_ARG(e.enabled || e.autoscale == "none", "elastic.autoscale.provider ", e.autoscale,
                 " needs elastic.enabled: true (workers are added and removed as members of an "
                 "elastic run)");
  if (!e.enabled) return;
  KRAB_CHECK_ARG(e.down_efficiency <= e.up_efficiency, "elastic.autoscale.down_efficiency ",
                 e.down_efficiency, " > elastic.autoscale.up_efficiency ", e.up_efficiency,
                 ": the band between them is where nothing moves");
  const std::string& mode = c.get_string("sync.mode");
  KRAB_CHECK_ARG(mode != "async",
                 "elastic.enabled applies to sync.mode sync; sync.mode async already survives "
                 "workers (the parameter servers count a dead worker out and a returning one "
                 "back in), and covers its servers with sync.replicas: 1 (each shard mirrored "
                 "on the next server)");
  KRAB_CHECK_ARG(mode != "local_sgd",
                 "elastic.enabled with sync.mode local_sgd is not supported yet: a dead "
                 "worker's local steps since the last average would be lost (use sync.mode: "
                 "sync)");
  KRAB_CHECK_ARG(c.get_string("comm.backend") != "mpi",
                 "elastic.enabled needs comm.backend gloo: an MPI communicator cannot be "
                 "abandoned and rebuilt without a dead peer (comm.backend mpi)");
  const int64_t stage = c.get_int("parallel.zero_stage");
  if (stage > 0) {
    const bool replicate = c.get_bool("elastic.replicate_shards");
    KRAB_CHECK_ARG(
        replicate || c.get_int("checkpoint.every_steps") > 0,
        "elastic.replicate_shards false with parallel.zero_stage ", stage,
        " and checkpoint.every_steps 0: a single failure would lose a shard and the whole "
        "run; keep elastic.replicate_shards true or set checkpoint.every_steps");
    KRAB_CHECK_ARG(c.get_string("parallel.offload") != "disk",
                   "elastic.enabled with parallel.offload disk is not built yet (a live reshard "
                   "writes the shards in RAM); use parallel.offload none");
  }
  // max_workers 0 stands for the workers at the start, which then also bound the run.
  const int max = e.max_workers > 0 ? e.max_workers : workers;
  const std::string max_text =
      e.max_workers > 0 ? str_cat("elastic.max_workers ", max)
                        : str_cat("elastic.max_workers 0 (= ", workers_key, " ", workers, ")");
  KRAB_CHECK_ARG(e.min_workers <= max, "elastic.min_workers ", e.min_workers, " > ", max_text);
  KRAB_CHECK_ARG(workers >= e.min_workers && workers <= max, workers_key, " ", workers,
                 " is outside [elastic.min_workers ", e.min_workers, ", ", max_text, "]");
  KRAB_CHECK_ARG(e.autoscale == "none" || max > workers, "elastic.autoscale.provider ", e.autoscale,
                 " with ", max_text, ": no room to add a worker to the ", workers, " of ",
                 workers_key, " (raise elastic.max_workers)");
  // The global batch is fixed for the run and re-split among the members (§5.1): every member
  // needs at least one example of it.
  const int64_t batch = c.get_int("data.batch_size");
  KRAB_CHECK_ARG(batch * workers >= max, "data.batch_size ", batch, " x ", workers_key, " ",
                 workers, " = global batch of ", batch * workers, " examples < ", max_text,
                 ": every worker needs at least one example of it");
}

// randomk with error feedback sends each value after 1 / ratio steps on average: in
// expectation the accumulator a = e + g follows a <- (1 - ratio) a + g and the step sends
// ratio * a, which is heavy-ball momentum with factor 1 - ratio and learning rate ratio * lr.
// On top of sgd's own momentum m that is momentum twice (on the 2-epoch CNN, ratio 0.1 and
// m = 0.9 ended 9 points below sync). Folding runs sgd without momentum at lr / (1 - m): the
// same step per unit of gradient in the steady state (lr / (1 - m)), with error feedback as the
// only momentum. The job's config is returned unchanged when there is nothing to fold.
core::Config with_folded_momentum(const core::Config& c) {
  const double m = c.get_float("train.optimizer.momentum");
  if (c.get_string("comm.compression") != "randomk" || !c.get_bool("comm.fold_momentum") ||
      c.get_string("train.optimizer.name") != "sgd" || m == 0 || !c.get_bool("comm.error_feedback"))
    return c;
  core::Config folded = c;
  char lr[64];
  std::snprintf(lr, sizeof(lr), "%.17g", c.get_float("train.optimizer.lr") / (1 - m));
  folded.set("train.optimizer.lr", lr);
  folded.set("train.optimizer.momentum", "0");
  return folded;
}

}  // namespace krab::train
