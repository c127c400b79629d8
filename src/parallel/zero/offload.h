// DiskOffload: `parallel.offload: disk` — the optimizer state of this rank's shards (stages
// 1-3) and, at stage 3, its fp32 master shards live in a file, not in RAM
// (docs/design/zero-sharding.md §6.2).
//
// The file is DIR/rank-R.bin (DIR is RUN_DIR/offload). It holds one region per unit and, inside
// it, one fp32 array of the shard's size per stored field: at stage 3 first the master shard,
// then the optimizer's fields (Adam/AdamW: exp_avg, exp_avg_sq, and max_exp_avg_sq with
// amsgrad; SGD with momentum: momentum_buffer; plain SGD: none). Each unit's region starts on a
// page boundary, so the windows below can advise the kernel about one unit at a time. The whole
// file is allocated with posix_fallocate when it is created: a sparse file mapped into memory
// would die of SIGBUS on the first write that finds the disk full, in the middle of a step;
// fallocate fails up front instead. It is mapped MAP_SHARED and the state tensors (and masters)
// are torch::from_blob views of the mapping (never resized, never parameters).
//
// The state is pre-created (zeros; Adam's step count 0) and installed in each unit optimizer's
// state() under the key LibTorch uses (the address of the shard's TensorImpl), so the
// optimizer finds it and updates it in place instead of allocating its own (§12 check 9). The
// result equals the non-offloaded run bit for bit: Adam's state starts at zero either way, and
// SGD's first step computes 0·momentum + g = g where LibTorch would clone g. A stage-3 master
// is the same bytes in the file as it would be in RAM, so that equality holds there too.
//
// step() walks the units with a window of two: it asks the kernel to read unit u+1 ahead
// (madvise WILLNEED), steps unit u, then starts its write-back (msync MS_ASYNC) and drops its
// pages from this process and the page cache (madvise and posix_fadvise DONTNEED), so the
// resident optimizer state (and masters) stays about two units (plus the kernel's fault-around
// of at most 64 KiB); after the last unit the whole mapping is dropped, so none of it stays in
// the process between steps. Dirty pages of a shared file mapping are handed to the page cache,
// not lost, when the process drops them. Stage 3 also reads a unit's master for each all-gather
// of the unit: prefetch_master() before the gather starts, release_master() once it has ended
// (Stage3Storage), so a gather leaves none of the mapping resident either.
//
// Files: the directory is created 0700 when missing and must not be a symlink; the file is
// created with O_EXCL|O_NOFOLLOW|O_CLOEXEC, mode 0600. A file left by a killed run at the same
// path is unlinked first (unlink does not follow a symlink, and O_EXCL then refuses anything
// planted in between). The destructor unmaps and removes the file, and the directory once it
// is empty.
//
// Thread safety: the training thread only (a Gloo thread may read a master while its gather is
// in flight; the training thread releases it only after waiting for the gather).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace torch::optim {
class Optimizer;
}

namespace krab::parallel::zero {

class ShardOptimizers;

// Where each unit's state lies in the file: with `master`, unit u's master shard at offset[u]
// and its optimizer field f at offset[u] + (1 + f) · numel[u] · 4 bytes; without, field f at
// offset[u] + f · numel[u] · 4 bytes.
struct OffloadRegions {
  std::vector<int64_t> numel;    // the shard's elements, per unit
  std::vector<int> fields;       // optimizer fields per unit
  bool master = false;           // stage 3: each region starts with the unit's fp32 master shard
  std::vector<int64_t> offset;   // byte offset of unit u's region (page-aligned)
  std::vector<int64_t> bytes;    // bytes of unit u's region (masters + state, no page padding)
  int64_t file_bytes = 0;        // the file's size: every region, each rounded up to a page
  int64_t state_bytes() const;   // Σ bytes: masters and optimizer state
  int64_t master_bytes() const;  // the masters' part of state_bytes() (0 without `master`)
};

// Pure: the regions of units with shards of `numel` elements and `fields` fp32 optimizer fields
// each, plus one fp32 master field first when `master` (stage 3), aligned to `page` bytes.
OffloadRegions plan_offload(const std::vector<int64_t>& numel, const std::vector<int>& fields,
                            int64_t page, bool master = false);

// The fp32 fields one shard's state has in `optimizer` (an SGD, Adam or AdamW of one group):
// Adam/AdamW 2 (3 with amsgrad), SGD 1 with momentum, 0 without.
int optimizer_fields(torch::optim::Optimizer& optimizer);

// Bytes free to an unprivileged writer (statvfs f_bavail · f_frsize) on the file system of
// `dir`, or of its nearest existing ancestor when `dir` does not exist yet. -1 when none can be
// read.
int64_t available_bytes(const std::string& dir);

// Refuses a run whose offload files do not fit: InvalidArgument "parallel.offload: disk needs
// N bytes in 'DIR' (R ranks × B bytes, + 5%) but its file system has A bytes free" unless
// `available` ≥ `ranks` · `bytes_per_rank` · 1.05. `available` comes from available_bytes() (a
// parameter so that tests can pass any number).
void check_offload_room(const std::string& dir, int ranks, int64_t bytes_per_rank,
                        int64_t available);

class DiskOffload;

// Collective: every rank checks the room for all ranks' files (they have the same size) on
// `dir`'s file system, the ranks agree (an all-reduce of the refusals) before any file is
// allocated — a rank that allocated first would shrink what the others see, and a rank
// refusing alone would leave the others waiting in the next collective — and then each makes
// its DiskOffload over `regions`. InvalidArgument naming parallel.offload on every rank when
// any rank found no room; DiskOffload's errors otherwise.
std::unique_ptr<DiskOffload> open_offload(const std::string& dir, comm::Communicator& comm,
                                          const OffloadRegions& regions);

class DiskOffload {
 public:
  // Creates, allocates and maps DIR/rank-`rank`.bin for `regions` (all zeros). Throws
  // krab::Error naming the file when it cannot be created, allocated (a full disk, a file-size
  // limit) or mapped; nothing is left behind then.
  DiskOffload(const std::string& dir, int rank, const OffloadRegions& regions);
  // The same, then install_state(shards, optimizers) (stages 1-2).
  DiskOffload(const std::string& dir, int rank, const OffloadRegions& regions,
              const std::vector<at::Tensor>& shards, ShardOptimizers& optimizers);
  ~DiskOffload();
  DiskOffload(const DiskOffload&) = delete;
  DiskOffload& operator=(const DiskOffload&) = delete;

  // Installs the state of unit u's shard (`shards[u]`: the tensor optimizers.at(u) steps; at
  // stage 3 master(u)) in optimizers.at(u), over the mapping. Once, before the first step.
  void install_state(const std::vector<at::Tensor>& shards, ShardOptimizers& optimizers);

  // Sets the learning rate and steps every unit's optimizer through the two-unit window.
  void step(ShardOptimizers& optimizers, double lr);

  // Stage 3 (regions().master): fp32 [numel[u]] over unit u's master field. Error without it.
  at::Tensor master(int unit) const;
  // Asks the kernel to read unit u's master ahead (a gather of the unit is about to read it).
  void prefetch_master(int unit) const;
  // After unit u's master was read by a gather or written: starts its write-back, drops its
  // pages from the page cache and the whole mapping from this process (a read fault maps
  // neighbouring pages too, possibly other units'; a gather in flight only faults its own
  // pages in again).
  void release_master(int unit) const;
  // Drops the whole mapping the same way (after a checkpoint was restored into it).
  void release_all() const;

  const std::string& path() const { return path_; }
  const OffloadRegions& regions() const { return regions_; }
  // The mapping: [data(), data() + regions().file_bytes).
  const char* data() const { return static_cast<const char*>(base_); }

 private:
  void advise(int unit, int advice) const;
  void release(int unit) const;
  void release_range(int64_t offset, int64_t bytes) const;

  std::string dir_;
  std::string path_;
  OffloadRegions regions_;
  int fd_ = -1;
  void* base_ = nullptr;
};

}  // namespace krab::parallel::zero
