// Stage3Storage: the parameters of ZeRO stage 3 — one flat fp32 storage per unit that holds
// bytes only while the unit runs, and one fp32 master shard per unit that this rank keeps
// (docs/design/zero-sharding.md §1.3, §3.2).
//
// adopt(u) takes over unit u's parameters, once, as UnitStorage does for stages 1-2: a flat of
// padded_u elements receives the parameters' values (padding 0), every parameter is pointed at
// its span with p.set_data(view) — same TensorImpl, so the optimizer-free model, the gradient
// accumulators and their hooks, a scripted module's slots all keep their handle — and the flat
// is broadcast from rank 0, so every rank starts from rank 0's weights. The rank copies its
// shard of the flat into a separate tensor, the master, and (unless asked to keep it) frees the
// flat: its storage is resized to 0 bytes, so the parameters keep their shapes but hold no
// memory, and a read of a freed unit dereferences a null pointer at once instead of reading
// stale values. Units are adopted one by one, so a model can be sharded while it is being
// built (§3.4): the peak is the units adopted so far as masters plus one unit whole.
//
// start_gather(u) resizes the storage back to padded_u · 4 bytes — a new allocation from the
// storage's FlatPool (flat_pool.h: mapped apart from malloc's heap, blocks of the largest
// non-root unit's size, reused once the first step has run); nothing may keep a data pointer across
// a free — and all-gathers every rank's master into it (asynchronous; the master is never the flat,
// so input and output do not alias); wait(u) waits. free(u) waits for a gather still in flight,
// then releases the bytes. Autograd's saved tensors refer to the parameters' TensorImpl and thus to
// the same StorageImpl: a unit freed after its forward and gathered again before its backward is
// seen by backward with the same values (§12, checks 1 and 3).
//
// Units of 0 elements have no storage and take part in no collective; they count as gathered.
//
// With a ward (shard replication, buddy.h) adopt() also keeps a copy of shard `ward` of the
// broadcast flat, the ward master: the owner's master of that shard, bit for bit, without a
// byte sent. ShardBuddy steps it; nothing here reads it again.
//
// With a DiskOffload (parallel.offload: disk, its regions planned with masters) the masters are
// not in RAM: master(u) is a view of unit u's master field in the offload file. adopt() writes
// the rank's shard into it and drops those pages (sharded construction never holds more than
// the unit being built); start_gather()/refresh() ask the kernel to read the master ahead, and
// wait() drops its pages again once the all-gather that read it has ended, so a gather leaves
// none of the file resident.
//
// Thread safety: the training thread only. Collectives are issued in call order, which the
// callers keep identical on every rank.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "engine/shard_layout.h"
#include "parallel/zero/flat_pool.h"
#include "parallel/zero/offload.h"

namespace krab::parallel::zero {

class Stage3Storage {
 public:
  // Nothing adopted yet. `rank` is this rank's index in the layout's world. With `offload`
  // (regions with masters, one per unit of `layout`) the masters live in its file. With
  // `ward` >= 0 (a shard index of the layout's world) adopt() keeps ward masters too;
  // InvalidArgument for a ward with offload (elastic.replicate_shards keeps it in RAM).
  Stage3Storage(const engine::ShardLayout& layout, int rank,
                std::unique_ptr<DiskOffload> offload = nullptr, int ward = -1);
  ~Stage3Storage();
  Stage3Storage(const Stage3Storage&) = delete;
  Stage3Storage& operator=(const Stage3Storage&) = delete;

  // Takes over unit `unit`'s parameters (`params[i]` is layout.unit(unit).params[i]: same shape,
  // fp32 CPU; InvalidArgument naming the parameter otherwise), broadcasts the flat from rank 0
  // (collective: every rank adopts the same units in the same order), keeps the master and
  // frees the flat unless `keep_gathered`. A unit is adopted once (Error otherwise).
  void adopt(int unit, const std::vector<at::Tensor>& params, comm::Communicator& comm,
             bool keep_gathered);
  // As adopt(), for an elastic run's later generation (train/live_reshard.h): the parameters
  // are pointed at the unit's flat without reading their values (a freed unit has none),
  // nothing is broadcast, and the master (and ward master) are 0 until the caller's restore
  // fills them. Local. Not with offload (Error).
  void adopt_blank(int unit, const std::vector<at::Tensor>& params, bool keep_gathered);
  bool adopted(int unit) const { return units_.at(unit).adopted; }
  bool all_adopted() const;

  // Whether unit u's flat holds bytes (gathered, or being gathered).
  bool allocated(int unit) const;
  bool gathering(int unit) const { return units_.at(unit).work != nullptr; }
  // Allocates unit u's flat and starts all-gathering the masters into it; no-op when it is
  // allocated already (gathered or in flight).
  void start_gather(int unit, comm::Communicator& comm);
  // All-gathers the masters into unit u's flat whether or not it holds bytes (allocating it if
  // needed): after an optimizer step changed the masters of a unit that stays gathered (the
  // root). Waits for a gather of u still in flight first.
  void refresh(int unit, comm::Communicator& comm);
  // Waits for unit u's gather, if one is in flight; rethrows its communication error.
  void wait(int unit);
  // Waits for every gather in flight.
  void wait_all();
  // Releases unit u's bytes (after waiting for its gather). No-op when already freed.
  void free(int unit);

  int num_units() const { return static_cast<int>(units_.size()); }
  const engine::ShardLayout& layout() const { return layout_; }
  // fp32 [padded_u]: the unit's flat (0 bytes while freed).
  const at::Tensor& flat(int unit) const { return units_.at(unit).flat; }
  // fp32 [S_u]: this rank's master shard of unit u, what the optimizer steps (a view of the
  // offload file with one).
  const at::Tensor& master(int unit) const { return units_.at(unit).master; }
  // The shard whose copy adopt() keeps, or -1.
  int ward() const { return ward_; }
  // fp32 [S_u]: the copy of shard ward() of unit u (undefined without a ward).
  const at::Tensor& ward_master(int unit) const { return units_.at(unit).ward_master; }
  // The offload file holding the masters, or null.
  DiskOffload* offload() const { return offload_.get(); }

  // Bytes of the master shards (in RAM or in the offload file).
  int64_t master_bytes() const;
  // Bytes of the flats allocated now, and the most at once so far.
  int64_t live_bytes() const { return live_bytes_; }
  int64_t peak_bytes() const { return peak_bytes_; }
  // The most at once so far of the flats' bytes counting the pool's blocks (in use — each the
  // largest unit's size, whatever unit is in it — and kept for reuse): a bound on what the
  // gathered working set adds to resident memory. The pool holds no more than its own peak in
  // use: at most the root's flat plus (units gathered at once) x (the largest unit).
  int64_t held_peak_bytes() const { return held_peak_bytes_; }
  // Where gathered flats get their bytes.
  const FlatPool& pool() const { return pool_; }

 private:
  struct Unit {
    bool adopted = false;
    at::Tensor flat;
    at::Tensor master;
    at::Tensor ward_master;
    comm::WorkPtr work;   // the gather in flight
    bool pooled = false;  // the flat's bytes are the pool's (gathered, not adopted)
  };
  void allocate(int unit);
  void note_peaks();
  void keep(int unit, at::Tensor flat, bool copy, bool keep_gathered);

  const engine::ShardLayout layout_;  // a copy: the storage may be built before its engine
  const int rank_;
  const int ward_;
  std::unique_ptr<DiskOffload> offload_;  // before units_: the masters are views of its mapping
  FlatPool pool_;                         // before units_: the flats name it as their allocator
  std::vector<Unit> units_;
  int64_t live_bytes_ = 0, peak_bytes_ = 0, held_peak_bytes_ = 0;
  int64_t pooled_bytes_ = 0;  // of live_bytes_, the flats whose bytes are the pool's
};

}  // namespace krab::parallel::zero
