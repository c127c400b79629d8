// FlatPool: the allocator of stage 3's unit flats — memory mapped apart from malloc's heap and
// reused from one gather to the next (docs/design/zero-sharding.md §3.2).
//
// Why: stage 3 allocates and frees every unit's flat twice a step. Through malloc, a flat under
// the mmap threshold is carved out of the heap, and the holes it leaves between long-lived
// blocks (master shards, optimizer state) cannot be given back; above the threshold every
// gather maps fresh pages that the kernel faults in and zeroes. The first cost memory (a
// stranded copy of the model), the second speed (a page fault per 4 KiB of every gather). A
// pool of mappings of its own has neither, and lets the rest of the process keep krab's
// heap settings (activations and gradients stay in the heap, as at stage 0).
//
// Policy: allocate(n) hands out a block of max(n, block_bytes) bytes rounded up to whole pages —
// a block the pool kept of exactly that size if it has one (no page faults: its pages are
// resident), a new anonymous mapping otherwise. With block_bytes the largest unit's bytes every
// block fits every unit, so a block passes from unit to unit however their sizes differ (a
// CNN's one large layer among small ones) and the pool needs no more blocks than units are
// gathered at once; pages a smaller unit never touches are never faulted in. When a block is
// freed (the flat's storage resized to 0 bytes, or destroyed) the pool keeps it as long as the
// bytes it holds — in use plus kept — stay within the most bytes that were ever in use at once;
// a new mapping that would exceed that bound unmaps kept blocks, oldest first. So the pool
// holds at most (units gathered at once) x (the largest unit) — stage 3's gathered working set,
// prefetch included — and in the steady state of training every gather reuses a kept block.
// release_kept() unmaps what is kept.
//
// Blocks are mapped with mmap(MAP_PRIVATE | MAP_ANONYMOUS): a new block reads as zeros, a kept
// one holds the bytes of its last use (a gather overwrites all of them).
//
// Lifetime: a block's DataPtr refers to the pool's shared state, not to the FlatPool object:
// a flat that outlives its pool (the model's parameters share the flat's storage) unmaps its
// block when it is freed. Do not allocate through a destroyed pool: a StorageImpl that names
// this pool as its allocator must be pointed elsewhere first (Stage3Storage does so).
//
// Thread safety: every member may be called from any thread (one mutex); a StorageImpl may be
// released on a thread other than the one that allocated it.
#pragma once

#include <c10/core/Allocator.h>

#include <cstdint>
#include <memory>

namespace krab::parallel::zero {

class FlatPool final : public c10::Allocator {
 public:
  // Blocks of at least `block_bytes` (0: of the size asked).
  explicit FlatPool(size_t block_bytes = 0);
  // Unmaps the kept blocks; blocks still in use are unmapped when they are freed.
  ~FlatPool() override;
  FlatPool(const FlatPool&) = delete;
  FlatPool& operator=(const FlatPool&) = delete;

  // A block of max(bytes, block_bytes) (whole pages); an empty DataPtr for 0. std::bad_alloc when
  // the kernel refuses the mapping.
  c10::DataPtr allocate(size_t bytes) const override;

  // Bytes of the blocks handed out and not freed (whole blocks, whatever was asked).
  int64_t in_use_bytes() const;
  // Bytes of the freed blocks the pool keeps for reuse.
  int64_t kept_bytes() const;
  // The most bytes in use at once so far: the bound of in_use + kept.
  int64_t peak_in_use_bytes() const;
  // How many mappings the pool has made so far (each allocation that found no kept block).
  int64_t mappings() const;
  // Unmaps every kept block.
  void release_kept();

  struct State;  // shared with the blocks handed out (flat_pool.cpp)

 private:
  const size_t block_bytes_;
  std::shared_ptr<State> state_;
};

}  // namespace krab::parallel::zero
