// The live reshard: a ZeRO run's committed state moved from the shards of generation g (world
// W) into the shards of generation g+1 (world W') between processes of a running job, with no
// file (docs/design/elastic.md §4.3). It is a resume fed by peers: the new engine's shards are
// filled by the same install_restore() a resume from a sharded checkpoint uses
// (train/checkpoint_reader.h), through a StateReader whose elements came over the new group
// instead of from files. So a live reshard to W' and a file resume of the same step at W' end in
// the same values, bit for bit.
//
// The exchange (collective on the new group, every member calls reshard_live):
//   1. holdings  one all-gather of what each process holds of generation g: its old rank (−1
//                for a joiner), the old world, its ward shard (elastic.replicate_shards), and
//                whether its shards have optimizer state (which fields, Adam's step count);
//                survivors must agree on the old world and the state;
//   2. plan      elastic::plan_transfer over the old layout (the caller's `layout_for(W)`: the
//                engine's own planning, so a joiner that never held the old layout computes the
//                same one) and the new one: every element of every new own shard gets exactly
//                one source; PeerLost when an old shard has no holder left (§4.4: an owner and
//                its ward's holder both gone), naming the shards;
//   3. moves     each move is one send/recv of count × (1 + fields) floats (values, then each
//                optimizer field present, in state_fields() order); every rank posts all its
//                receives and sends, then waits for them all (no ordering between ranks, so no
//                deadlock); a move inside one process is a copy;
//   4. install   install_restore() reads the received runs; frozen parameters, buffers and the
//                random generator are this process's own (the new engine broadcast rank 0's
//                frozen parameters and buffers when it was built).
// The new ward shards are not moved: the engine's after_restore() re-copies every ward from
// its owner (parallel/zero/buddy.h), which the caller runs next.
//
// Bytes on the wire: each new shard's elements that its process did not hold, 4(1 + k) bytes
// each (k optimizer fields); a survivor that keeps its rank and whose shard did not move
// receives nothing of it.
//
// Failure: any error of the group (a second failure during the exchange) is thrown after every
// op posted has ended (no op still writes into a buffer this returns to the allocator); the
// caller abandons the generation as after any failed step.
#pragma once

#include <functional>

#include "engine/engine.h"
#include "engine/shard_layout.h"
#include "train/checkpoint.h"

namespace krab::comm {
class Communicator;
}

namespace krab::train {

// `previous`: this process's state of generation g (a ZeRO engine's state(), its group
// aborted, at the committed step), or null for a joiner. `target`: the new engine's state()
// on `group` (sharded). `meta`: the job's checkpoint meta at the committed step (what
// reader.meta() says; nothing is checked against it). Collective on `group`.
void reshard_live(comm::Communicator& group, const engine::TrainState* previous,
                  const engine::TrainState& target,
                  const std::function<engine::ShardLayout(int world)>& layout_for,
                  const CheckpointMeta& meta);

}  // namespace krab::train
