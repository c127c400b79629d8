// State that moves between ranks of a running job rather than through files: rank 0's bytes
// to every rank (a resume without a shared file system), and an elastic run's state transfer
// to joiners (docs/design/elastic.md §4.1): rank 0 encodes its full replica exactly as a
// checkpoint (train/checkpoint.h, in memory, unsealed: the bytes never leave the job's own
// group) and every rank receives it; a joiner decodes it into its model and optimizer, with
// the same checks a resume makes (model, signature, global batch).
#pragma once

#include <cstdint>
#include <string>

#include "engine/engine.h"
#include "train/checkpoint.h"

namespace krab::comm {
class Communicator;
}

namespace krab::train {

// Rank 0's `bytes` reach every rank (collective; the others' argument is ignored).
std::string broadcast_bytes(comm::Communicator& group, std::string bytes);

// ElasticEngineOptions::transfer for full replicas (data parallel): rank 0 sends `state` at
// `meta.step`; a `receiving` rank loads it and returns its step, the others return meta.step.
// Collective on `group`.
int64_t transfer_replica(comm::Communicator& group, const engine::TrainState& state,
                         const CheckpointMeta& meta, bool receiving);

}  // namespace krab::train
