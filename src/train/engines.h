// The one place a job's sync.mode becomes an Engine (engine/engine.h): data parallel (with the
// job's compressor), local SGD, or a parameter-server worker. A new strategy is one more case
// here and one more Engine class in its layer.
#pragma once

#include <memory>
#include <vector>

#include "comm/factory.h"
#include "core/config.h"
#include "engine/engine.h"
#include "engine/shard_layout.h"
#include "models/model.h"
#include "train/options.h"

namespace krab::train {

// Builds the engine for `c` (the job as it runs, momentum folded) around the model `spec`
// describes (models::make_model, with torch's generator as the caller seeded it), on this rank
// of `world`. Collective engines connect their group here (a Timeout names the rendezvous and
// comm.timeout_s); the parameter-server worker waits for its servers' addresses. ZeRO stage 3
// connects first and builds the model sharded as it is constructed (a model larger than one
// worker never exists whole: parallel/zero/stage3_build.h); the others build it whole.
// With elastic.enabled, data parallel runs inside elastic::ElasticEngine (elastic/
// elastic_engine.h), which rebuilds the group when the membership changes: `member` is this
// process's member id (KRAB_MEMBER_ID from krab's launcher; InvalidArgument when empty), and a
// `joining` member enters a running job: no group of its own at first, the state from rank 0.
// `etcd_endpoints` (the etcd rendezvous, KRAB_RDZV_ENDPOINTS): the membership's records and
// requests live in etcd under the job secret's prefix (elastic/etcd_store.h), not in the
// rendezvous store, whose host may die with its machine.
struct ElasticPlace {
  std::string member;
  bool joining = false;
  std::string etcd_endpoints;
  std::string etcd_run;  // the run's id (KRAB_RDZV_RUN): its keys' prefix in etcd
};
std::unique_ptr<engine::Engine> make_engine(const core::Config& c, const TrainOptions& options,
                                            const comm::WorldInfo& world,
                                            const models::ModelSpec& spec, int64_t total_steps,
                                            const ElasticPlace& place = {});

// parallel.offload: disk, before any worker is spawned: the offload directory
// (RUN_DIR/offload) must be writable and its file system must have room for every rank's file
// (the same layout, optimizer fields and, at stage 3, master shards the ZeRO engine will use, over
// the model's trainable parameters `trainable` (named_parameters order, or
// models::describe_parameters' rows), its `unit_candidates` (what `parallel.wrap: auto` takes) and
// `workers` ranks) + 5%. InvalidArgument naming parallel.offload, the directory and both numbers
// (parallel/zero/offload.h's check_offload_room). No-op otherwise. Builds no model.
void check_offload_room(const core::Config& job, const std::vector<engine::ParamShape>& trainable,
                        const std::vector<std::string>& unit_candidates, int workers);

// Refuses bad comm.* compression keys and combinations, naming the keys of `job` (the job as
// written, before momentum is folded).
void check_compression_options(const core::Config& job);

}  // namespace krab::train
