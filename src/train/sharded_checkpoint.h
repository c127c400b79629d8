// Sharded checkpoints (docs/design/zero-sharding.md §4.2, §4.3): every rank of a sharded
// engine (engine::TrainState.sharded) writes its own shard in parallel; rank 0 writes the
// manifest only once every rank has written its shard; `latest` moves after the manifest.
//
// Writing, every rank, collectively over the engine's group:
//   1. rank 0 draws the checkpoint id (128 random bits) and broadcasts it;
//   2. each rank streams step-N/shard-RRRRR-of-WWWWW.krab (train/shard_file.h) through an
//      atomic writer: this rank's values and optimizer state of every unit, and on rank 0 also
//      buffers, frozen parameters and the generator state (train/manifest.h lists the entries);
//   3. all ranks allgather (ok, size, SHA-256, first error): if any rank failed, every rank
//      throws that rank's error naming it, `latest` stays where it was and the previous
//      checkpoint stays in force (the failed step directory holds no manifest, so it is never
//      read, and the next checkpoint's pruning removes it);
//   4. rank 0 writes manifest.krab (sealed like state.krab), moves `latest`, prunes; then it
//      broadcasts whether that worked, so that every rank returns or throws together.
//
// Restoring (restore_checkpoint) runs the protocol of train/checkpoint_reader.h on every rank
// with one allgather between verifying and installing: all or nothing across the group.
#pragma once

#include <string>

#include "engine/engine.h"
#include "train/checkpoint.h"

namespace krab::comm {
class Communicator;
}

namespace krab::train {

// The seal of a run's checkpoints: core::read_seal_key()'s key ("" = unsealed) and
// checkpoint_job()'s identity.
struct CheckpointSeal {
  std::string key, job;
};

// Steps 1-4 above for checkpoint `meta` of `state` (state.sharded set; rank = comm.rank()).
// Returns the manifest's path on rank 0, "" elsewhere. Collective: every rank calls it with
// the same meta and keep. Throws krab::Error naming the rank and file on a failed write.
std::string save_sharded_checkpoint(comm::Communicator& comm, const std::string& run_dir,
                                    const CheckpointMeta& meta, const engine::TrainState& state,
                                    const CheckpointSeal& seal, int keep);

// Restores the checkpoint in `step_dir` (either format) into `state` (either kind) on every
// rank of `comm` (null: this process alone), all or nothing: each rank opens and verifies what
// its ranges need, the ranks agree, and only then does every rank install. Any rank's failure
// makes every rank throw the first failing rank's error (same kind: CorruptData,
// InvalidArgument, NotSupported, else Error), with nothing installed anywhere. The caller calls
// engine->after_restore() afterwards. Returns the checkpoint's meta.
CheckpointMeta restore_checkpoint(comm::Communicator* comm, const std::string& step_dir,
                                  const CheckpointSeal& seal, const CheckpointMeta& expect,
                                  const engine::TrainState& state);

}  // namespace krab::train
