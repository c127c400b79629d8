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
#include "train/job.h"

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

// What preflight() learned that the launcher needs to size the run.
struct PreflightInfo {
  int64_t parameters = 0;  // the model's parameter count
  int64_t data_bytes = 0;  // the training and test tensors every worker loads
};

// Checks what can be checked before any process is spawned: data present and readable, batch
// not larger than the data, model buildable, checkpoint resumable. Throws InvalidArgument /
// CorruptData naming the key or file. `workers` is the total world size.
PreflightInfo preflight(const core::Config& config, int workers);

// The report's samples_per_sec: a number, or null with samples_per_sec_note saying why when
// nothing was measured (a run of fewer steps than its warm-up). `measured_steps` counts the
// steps after warm-up.
void set_samples_per_sec(nlohmann::json& report, double samples_per_sec, int64_t measured_steps);

// "1234 samples/s", or "samples/s not measured" for a report whose samples_per_sec is null.
std::string describe_samples_per_sec(const nlohmann::json& report);

}  // namespace krab::train
