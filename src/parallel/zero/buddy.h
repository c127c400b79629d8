// ShardBuddy: every ZeRO shard kept on a second rank, so that one dead rank loses no state
// (docs/design/elastic.md §4.2: the mission's "task replication").
//
// Ranks form a ring. Rank r is the **buddy** of shard r−1 (mod W), its **ward**; rank r's own
// shard has its buddy at r+1. A buddy holds a copy of its ward — the values and the optimizer
// state of the ward shard of every unit — and keeps it equal to the owner's without ever
// receiving parameters or optimizer state after the start:
//
//   start       the ward's values come from the same broadcast initial parameters the owner's
//               come from (stages 1-2: the ward chunk of every unit's flat, which every rank
//               holds anyway; stage 3: a master copy of the ward chunk, kept by Stage3Storage
//               when it adopts each unit); the optimizer state starts empty on both.
//   restore     a restore writes the own shards only (a resume from files, a live reshard);
//               resync() then sends each rank's own values and optimizer state to its buddy
//               once, so TrainState::ward need not be filled by the restore (filling it is
//               harmless: the same bits arrive).
//   each step   once the gradient shards are final (GradReducer::finish()), exchange() sends
//               this rank's gradient shard of every unit to its buddy and receives its ward's
//               from rank r−1: one send and one recv per non-empty unit, point to point, tag
//               kBuddyTag + unit. step(lr) then steps the ward shards with a second set of
//               unit optimizers made by the job's own OptimizerFactory.
//
// SGD (momentum, nesterov, weight decay) and Adam / AdamW are element-wise and do not depend on
// where their tensor sits (zero-sharding design §12 check 13: bit-equal whole, split and at an
// offset), so the same gradient bits, the same values, the same state and the same learning
// rate give the owner and the buddy the same bits after every step, Adam's step count
// included. Stages 1-2 step the ward's values in place in the flat; the all-gather after the
// step then overwrites that chunk with the owner's bits, which are the same.
//
// Why point to point and not a collective: the ring shift moves exactly one shard per rank
// (4Ψp/N bytes sent per step, memory_model.h's zero_traffic() with replicate_shards); an
// all-to-all would move equal chunks to every rank (W−1 shards), an all-gather the same.
// One message per unit, not one concatenated buffer: no copy, and the grad shards are
// already separate tensors.
//
// Cost per rank (memory_model.h's `ward` term, exactly what bytes() measures once a step ran):
// the ward gradient shards 4Ψp/N (alive from exchange() to step()), the ward optimizer state
// 4kΨp/N, and at stage 3 the ward masters 4Ψp/N. A group of one has no buddy: the engines
// build no ShardBuddy (ward_shard() is −1) and replication costs nothing.
//
// Failure: exchange() waits for every send and recv before rethrowing the first error
// (MembershipChanged, PeerLost, Timeout), so no op it started still writes into a gradient it
// hands to step(). After a failure the tensors it sent and received into stay referenced until
// the next successful exchange: an aborted group's ops may still use them (comm/communicator.h).
//
// Thread safety: the training thread only, like the engines that own it.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "engine/shard_layout.h"
#include "engine/sharded_state.h"
#include "parallel/dp_engine.h"
#include "parallel/zero/shard_optimizer.h"

namespace krab::parallel::zero {

// The first point-to-point tag the exchange uses (unit u: kBuddyTag + u), apart from any
// small tag another user of the group's send/recv picks.
constexpr int kBuddyTag = 1 << 20;

// The rank that keeps a copy of `rank`'s shard: (rank + 1) mod world; −1 for a group of one.
int buddy_rank(int rank, int world);
// The shard `rank` keeps a copy of, its ward: (rank − 1) mod world; −1 for a group of one.
int ward_shard(int rank, int world);

// What the ward copy costs one rank, in bytes (MemoryStats counts them with the own shard's:
// values with params, grads with the grad shards, optimizer with optimizer).
struct WardBytes {
  int64_t values = 0;     // stage 3: the ward masters; stages 1-2: 0 (they are in the flats)
  int64_t grads = 0;      // the ward gradient shards, from exchange() to step()
  int64_t optimizer = 0;  // the ward optimizers' state tensors
  int64_t total() const { return values + grads + optimizer; }
};

class ShardBuddy {
 public:
  // `ward_values[u]` is this rank's copy of the ward's shard of unit u, fp32
  // [layout.shard_numel(u)] (stages 1-2: the ward chunk of unit u's flat; stage 3: the ward
  // master); `values_owned`: whether those tensors are memory of their own (stage 3) rather than
  // views of the parameters (counted in bytes().values). `rank` is this rank in the layout's
  // world, which must be >= 2 (InvalidArgument otherwise). The ward optimizers come from
  // `make_optimizer` (ShardOptimizers' refusals).
  ShardBuddy(const engine::ShardLayout& layout, int stage, int rank,
             std::vector<at::Tensor> ward_values, bool values_owned,
             const OptimizerFactory& make_optimizer);
  ~ShardBuddy();
  ShardBuddy(const ShardBuddy&) = delete;
  ShardBuddy& operator=(const ShardBuddy&) = delete;

  // Collective between ring neighbours (every rank of `comm` calls it at the same point, after
  // its reduce): sends `own_grads[u]` (this rank's final gradient shard of unit u; undefined
  // for a unit of 0 elements) to buddy_rank() and receives the ward's into this object. Waits;
  // rethrows the first communication error after every op ended.
  void exchange(comm::Communicator& comm, const std::vector<at::Tensor>& own_grads);
  // Steps every ward shard with the gradient exchange() received, at learning rate `lr`, then
  // drops those gradients. No-op for units without one.
  void step(double lr);
  // Collective between ring neighbours: sends `own` (this rank's shard state: values, every
  // optimizer field, Adam's step count; no fields before a first step) to buddy_rank() and
  // makes the ward copy the ward's, bit for bit. Per non-empty unit the values and a 16-byte
  // header (state present, step), then the fields: 4(1+k)Ψp/N + 16 bytes a unit sent. Waits;
  // rethrows the first communication error after every op ended (the ward is then unusable
  // until a resync succeeds).
  void resync(comm::Communicator& comm, const engine::ShardedState& own);

  int ward() const { return ward_; }
  // The ward's shard as a checkpoint or a transfer sees it: values and optimizers per unit,
  // same layout and stage as the own shard's ShardedState.
  const engine::ShardedState& state() const { return state_; }
  ShardOptimizers& optimizers() { return *optimizers_; }
  // The bytes held now; grads is the most held at once so far.
  WardBytes bytes() const;

 private:
  void finish(std::vector<comm::WorkPtr>& works, std::vector<at::Tensor> used);

  const engine::ShardLayout& layout_;
  const int rank_;
  const int ward_;
  const bool values_owned_;
  std::vector<at::Tensor> values_;
  std::vector<at::Tensor> grads_;  // by unit; undefined outside exchange() .. step()
  std::vector<at::Tensor> held_;   // kept after a failed exchange (see the class comment)
  int64_t grad_bytes_peak_ = 0;
  std::unique_ptr<ShardOptimizers> optimizers_;
  engine::ShardedState state_;
};

}  // namespace krab::parallel::zero
