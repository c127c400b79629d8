// The transfer plan: which process sends which elements of the last committed step's sharded
// state to whom when a ZeRO run changes its world from W to W' (docs/design/elastic.md §4.3).
// Pure: layouts and holdings in, a list of moves out; no tensors, no communication. Every rank
// of the new generation computes it from the same inputs (both layouts are functions of the
// model and the world; the holdings come from one all-gather, recover() step 4) and gets the
// same list in the same order, so the exchange needs no negotiation: each move is one
// send/recv pair, and both ends know it.
//
// Terms. Old shard i is rank i's shard of every unit in the old layout (ShardLayout::shard).
// With replicated shards (elastic.replicate_shards, §4.2) rank r also keeps its *ward*, the
// shard of rank r − 1 mod W, bit-identical to the owner's. After a change, the processes of the
// new generation are numbered 0..W'−1 (new ranks); a survivor also has its old rank, a joiner
// has none and holds nothing.
//
// The plan. For every new rank j, its own new shard j and, when wards are wanted, its new ward
// (shard j − 1 mod W'), each unit in order, and each piece of that range in flat order
// (ShardLayout::pieces, the function resume's resharding is built on): the piece's parameter is
// found in the old layout by name (ShardLayout::locate), its elements are cut where old shard
// boundaries fall, and each run [a, a + n) of old shard i gets one source: j itself when j
// holds old shard i (a local copy, no bytes on the wire), else the process whose old rank is i
// (the owner), else the holder of i's ward (old rank i + 1 mod W), else any other holder, the
// lowest new rank first. Padding and 0-element parameters yield no moves.
//
// What every move of the result satisfies (tests/elastic/transfer_plan_test.cpp checks it
// element by element): every parameter element of every new shard (and ward) is the target of
// exactly one move; the source holds the old shard the elements are read from; no source is a
// process that is gone.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/shard_layout.h"

namespace krab::elastic {

// What one process of the new generation holds of the old generation's sharded state.
struct Holder {
  int new_rank = 0;
  int old_rank = -1;            // -1: a joiner, which must hold nothing
  std::vector<int> old_shards;  // old shards it holds, any order: its own (old_rank) and, with
                                // replicated shards, its ward (old_rank − 1 mod W)
};

// Elements [offset, offset + count) of parameter `param` (row-major, as tensor.view(-1) numbers
// them) go from new rank `src`, which reads them from its copy of old shard `old_shard`, to new
// rank `dst`, which writes them into its own new shard (ward = false) or its new ward shard
// (ward = true). src == dst is a copy inside one process.
struct Move {
  int src = 0;
  int dst = 0;
  int old_shard = 0;
  bool ward = false;
  std::string param;
  int64_t offset = 0;
  int64_t count = 0;

  bool operator==(const Move& o) const {
    return src == o.src && dst == o.dst && old_shard == o.old_shard && ward == o.ward &&
           param == o.param && offset == o.offset && count == o.count;
  }
};

// The moves in their canonical order: by dst; for one dst its own shard before its ward; then
// by unit of the new layout; then in flat order. Both ends of every move walk this one list.
struct TransferPlan {
  std::vector<Move> moves;
};

// The old shards (ascending) that hold at least one parameter element and that no holder
// holds: the state a change cannot recover from memory (§4.4: an owner and its ward holder
// gone together, or any owner without replicated shards). Validates `holders` as
// plan_transfer does.
std::vector<int> lost_shards(const engine::ShardLayout& old_layout,
                             const std::vector<Holder>& holders);

// The plan for moving the state sharded by `old_layout` (world W) into `new_layout` (world W'),
// with `holders` (one per new rank, any order) saying who holds what, and `wards` whether the
// new ranks keep ward shards. A world of one has no buddy: with W' = 1, `wards` plans nothing
// more. Deterministic: the same layouts and holdings (in any order) give the same plan.
// Throws:
//   - PeerLost when lost_shards() is not empty; the message names the lost old shards and
//     whose copies they were, for §4.4's message (the caller adds the units and the checkpoint);
//   - InvalidArgument when `holders` does not have exactly one entry per new rank 0..W'−1, an
//     old rank is outside [0, W) or given twice, an old shard is outside [0, W) or listed twice
//     by one holder, a joiner holds a shard, or a
//     parameter of the new layout is missing from the old one or has another element count.
TransferPlan plan_transfer(const engine::ShardLayout& old_layout,
                           const engine::ShardLayout& new_layout,
                           const std::vector<Holder>& holders, bool wards);

}  // namespace krab::elastic
