// The worker side of `krab train`: one rank's whole training run.
//
// run_worker() builds data, model, communicator, DataParallel and optimizer from the job's
// Config, trains for train.steps (or train.epochs), evaluates on the test split, and on rank 0
// writes the final checkpoint, model.pt and (when asked) the JSON report. Rank 0 draws the
// progress bar; other ranks are quiet.
//
// Determinism contract: worker r of W takes slice r of each global batch of W x
// data.batch_size examples, so W workers reproduce one worker with the W-times larger batch
// up to float reduction order.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "comm/factory.h"
#include "core/config.h"

namespace krab::train {

struct WorkerOptions {
  std::string report_path;  // "" = no report
  bool show_progress = true;
};

// Runs the job on this rank. Returns the report (on every rank; bytes/accuracy are global).
// Throws krab::Error subclasses (InvalidArgument for bad input, PeerLost/Timeout when the
// group breaks).
nlohmann::json run_worker(const core::Config& config, const comm::WorldInfo& world,
                          const WorkerOptions& options);

// sync.mode async, one worker: pulls parameters from the sync.servers parameter servers,
// pushes its gradients; no collective group (a dead worker breaks nothing). See async.cpp.
nlohmann::json run_async_worker(const core::Config& config, const comm::WorldInfo& world,
                                const WorkerOptions& options);

// sync.mode async, parameter server `shard` of sync.servers for `workers` workers, reached
// through the store at `rendezvous`. Server 0 (the chief) waits for every worker to finish or
// be counted out, collects the other shards, evaluates, writes model.pt and the report, and
// returns the report; the others return once the chief has their shard.
nlohmann::json run_param_server(const core::Config& config, int shard,
                                const comm::Endpoint& rendezvous, int workers,
                                const WorkerOptions& options);

// Refuses what sync.mode async cannot do (no servers, another backend, checkpoints), naming
// the key. No-op for the other modes.
void check_async_options(const core::Config& config);

// Checks what can be checked before any process is spawned: data present and readable, batch
// not larger than the data, model buildable, checkpoint resumable. Throws InvalidArgument /
// CorruptData naming the key or file. `workers` is the total world size.
void preflight(const core::Config& config, int workers);

// checkpoint.dir with {name} replaced.
std::string run_directory(const core::Config& config);

}  // namespace krab::train
