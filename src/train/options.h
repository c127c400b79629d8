// The training loop's options, typed once at the edge: everything the loop reads from a job's
// Config, with enums instead of strings past this point. Cross-key checks of the modes live
// here too (what the compressor's and the parameter server's own options cannot see).
#pragma once

#include <cstdint>
#include <string>

#include "core/config.h"
#include "train/precision.h"
#include "train/schedule.h"

namespace krab::train {

enum class SyncMode { kSync, kLocalSgd, kAsync };

struct TrainOptions {
  SyncMode sync_mode = SyncMode::kSync;
  int64_t batch = 0;          // data.batch_size: examples per worker and micro-batch
  int64_t micro_batches = 1;  // train.grad_accum
  int64_t seed = 0;
  int threads = 1;  // train.threads_per_worker
  Schedule schedule = Schedule::kConstant;
  double base_lr = 0;
  int64_t lr_warmup_steps = 0;  // train.warmup_steps
  int64_t checkpoint_every = 0;
  int checkpoint_keep = 0;
  bool resume = false;
  int64_t eval_every = 0;
  int64_t eval_examples = 0;  // train.eval_examples: 0 = the whole test split
  int64_t log_every = 0;
  int64_t local_sgd_period = 1;            // sync.period
  int64_t local_sgd_warmup = 0;            // sync.warmup_steps
  int zero_stage = 0;                      // parallel.zero_stage: 0 = full replicas, 1-2 = ZeRO
  Precision precision = Precision::kFp32;  // train.precision
  bool activation_checkpointing = false;   // model.activation_checkpointing

  static TrainOptions from_config(const core::Config& c);
};

// The cross-key refusals of parallel.zero_stage (InvalidArgument naming both keys): a stage > 0
// with sync.mode local_sgd or async (a worker holding 1/N of the optimizer state cannot step alone,
// and a server holds the state already); with a comm.compression other than fp16 or bf16 (not
// composed with the reduce-scatter yet); with comm.momentum_correction or comm.clip_norm (they keep
// a full-size velocity or norm per bucket, which stage 2 drops and the sharded reduce-scatter does
// not apply); and, until sharded checkpoints land, with checkpoint.every_steps > 0 or
// checkpoint.resume (temporary). parallel.offload: disk needs a stage of 1, 2 or 3. from_config()
// runs it; so does the launcher's preflight, before any worker starts.
void check_zero_options(const core::Config& c);

// InvalidArgument naming both keys for parallel.balance: auto with a sync.mode other than sync
// or with parallel.zero_stage 3. from_config() runs it.
void check_balance_options(const core::Config& c);

// The elastic.* keys (docs/design/elastic.md §7), typed. Read by the launcher, which keeps the
// membership (elastic/local_keeper.h), and by the workers (heartbeat period).
struct ElasticOptions {
  bool enabled = false;
  int min_workers = 1;
  int max_workers = 0;  // 0: the number of workers at the start (parallel.workers)
  double wait_s = 60;
  int64_t heartbeat_ms = 200;
  int64_t dead_after_ms = 3000;
  double lease_s = 5;
  bool replace_dead = false;
  int max_restarts = 3;
  bool replicate_shards = true;
  std::string autoscale;  // elastic.autoscale.provider: "none", "local" or "slurm"
  double up_efficiency = 0.6;
  double down_efficiency = 0.3;
  int64_t window_steps = 20;
  int64_t cooldown_steps = 60;

  static ElasticOptions from_config(const core::Config& c);
};

// The cross-key refusals of elastic.enabled (InvalidArgument, exit 2, naming both keys), for a
// run of `workers` workers at the start (`workers_key` names where that number came from:
// parallel.workers or --nproc-per-node): elastic.min_workers above elastic.max_workers; the
// workers outside [min_workers, max_workers]; sync.mode async (its servers already survive
// workers) or local_sgd (a dead worker's local steps would be lost); comm.backend mpi (an MPI
// group cannot be abandoned and rebuilt); parallel.zero_stage > 0 and elastic.replace_dead
// (not built yet); a global batch (data.batch_size x workers) smaller than
// elastic.max_workers, which would leave a worker without an example. Nothing when elastic is
// off. The launcher runs it before spawning anything.
void check_elastic_options(const core::Config& c, int workers,
                           const std::string& workers_key = "parallel.workers");

// sync.mode's name in the report and in messages.
const char* sync_mode_name(SyncMode mode);

// randomk with error feedback is heavy-ball momentum of its own (see options.cpp): the job with
// sgd's momentum folded into the learning rate, or the job unchanged when nothing is folded.
core::Config with_folded_momentum(const core::Config& c);

}  // namespace krab::train
