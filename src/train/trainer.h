// The worker side of `krab train`: one training loop for every mode.
//
// Trainer owns what does not depend on how gradients travel: the data and the global-batch
// sampler, the learning-rate schedule, micro-batches (gradient accumulation), evaluation,
// checkpoints, progress and the report. It drives an Engine (engine/engine.h) chosen from
// sync.mode (train/engines.h): data parallel, local SGD or a parameter-server worker. Events
// (core/events.h) carry what it measures to the progress bar and the report.
//
// Determinism contract: the global batch sequence depends only on the seed (data/sampler.h);
// the engine decides which slice of each global batch this rank computes, so W workers
// reproduce one worker with the W-times larger batch up to float reduction order.
#pragma once

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "comm/factory.h"
#include "core/config.h"
#include "train/job.h"
#include "train/report.h"

namespace krab::train {

struct WorkerOptions {
  std::string report_path;  // "" = no report
  bool show_progress = true;
  // Rank 0 rewrites it with the number of completed steps after every step; "" = not written.
  std::string progress_file;
  // This process as a member of an elastic run (`<node>.<slot>.<incarnation>`, from the
  // launcher's KRAB_MEMBER_ID); "" outside elastic runs.
  std::string member_id;
  // A member entering a running elastic job (a replacement, KRAB_ELASTIC_JOIN=1): it receives
  // the state from rank 0 instead of starting or resuming.
  bool joining = false;
  // The etcd rendezvous's endpoints (KRAB_RDZV_ENDPOINTS); "" with the c10d one.
  std::string etcd_endpoints;
  std::string etcd_run;  // KRAB_RDZV_RUN
  // Monitoring (docs/monitoring.md). `monitor_dir`: the launcher's private directory where
  // this rank keeps a snapshot of its metrics for the node's endpoint (KRAB_MONITOR_DIR; ""
  // when monitor.port is 0). `trace_path`: where this rank writes its part of --trace's
  // timeline (KRAB_TRACE_PART; "" without --trace).
  std::string monitor_dir;
  std::string trace_path;
};

class Trainer {
 public:
  // Builds data, model and engine for this rank of `world` (a collective engine connects its
  // group here) and resumes from the last checkpoint when checkpoint.resume is set.
  Trainer(const core::Config& job, const comm::WorldInfo& world, const WorkerOptions& options);
  ~Trainer();
  // Trains to the end. Returns the report (on every rank of a collective engine: bytes and
  // accuracy are global; rank 0 writes it and model.pt), or a parameter-server worker's summary.
  nlohmann::json run();

 private:
  struct Loop;
  std::unique_ptr<Loop> loop_;
};

// Runs the job on this rank (sync.mode sync or local_sgd): Trainer(...).run().
// Throws krab::Error subclasses (InvalidArgument for bad input, PeerLost/Timeout when the
// group breaks).
nlohmann::json run_worker(const core::Config& config, const comm::WorldInfo& world,
                          const WorkerOptions& options);

// sync.mode async, one worker: pulls parameters from the sync.servers parameter servers,
// pushes its gradients; no collective group (a dead worker breaks nothing). Trainer(...).run().
nlohmann::json run_async_worker(const core::Config& config, const comm::WorldInfo& world,
                                const WorkerOptions& options);

// sync.mode async, parameter server `shard` of sync.servers for `workers` workers, reached
// through the store at `rendezvous`. Server 0 (the chief) waits for every worker to finish or
// be counted out, collects the other shards, evaluates, writes model.pt and the report, and
// returns the report; the others return once the chief has their shard. See async.cpp.
nlohmann::json run_param_server(const core::Config& config, int shard,
                                const comm::Endpoint& rendezvous, int workers,
                                const WorkerOptions& options);

// Refuses what sync.mode async cannot do (no servers, another backend, checkpoints), naming
// the key. No-op for the other modes.
void check_async_options(const core::Config& config);

}  // namespace krab::train
