// The global-batch sampler: the core of krab's determinism contract (ARCHITECTURE.md).
//
// Training is a sequence of global steps. Which examples global step s uses depends only on
// (dataset size, global batch, seed) — never on the number of workers — and worker r of W takes
// the r-th of W equal, contiguous slices of that global batch. Synchronous data parallel on W
// workers therefore sees exactly the batches single-worker training with the same global batch
// sees, and averaging the W slice gradients reproduces the single-worker gradient up to the
// order of floating-point additions.
//
// How the sequence is built:
//   - steps are grouped into epochs of steps_per_epoch() = dataset_size / global_batch steps;
//     the last incomplete global batch of each epoch is dropped (every step is a full batch,
//     so every worker gets the same number of examples at every step);
//   - epoch e visits the examples in the order of a permutation drawn from (seed, e) with krab's
//     own generator (data/rng.h: mt19937_64 + Fisher-Yates), never torch's global generator;
//   - for a dataset read lazily from shards (a ShardLayout with a window smaller than the
//     number of shards, data/shards.h), that permutation is drawn in two levels so that a
//     stretch of steps reads only a few shards: the shard order is shuffled, the shuffled
//     order is cut into windows of `window` shards, and the examples of each window are
//     shuffled among themselves; the epoch visits window after window. It is still a function
//     of (seed, e, layout) alone. With a window of every shard (or no layout) it is one
//     uniform shuffle of all examples, the same as for an in-memory dataset of that size;
//   - step s is epoch s / steps_per_epoch(), and takes the next global_batch entries of that
//     epoch's permutation.
//
// Thread safety: const methods share a cached permutation (the current epoch's) and are NOT
// safe to call concurrently on one object; give each thread its own sampler (they are cheap,
// and equal arguments give equal sequences).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "data/dataset.h"

namespace krab::data {

// Examples [begin, end) of a global batch: one rank's share of a step. Equal slices today
// (equal_slice); a load balancer may hand out unequal ones, an elastic world a different count.
struct BatchSlice {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

// Slice `index` of `count` slices of a global batch of `global_batch` examples whose sizes
// differ by at most one (all equal when count divides global_batch).
inline BatchSlice equal_slice(int64_t global_batch, int64_t index, int64_t count) {
  return {global_batch * index / count, global_batch * (index + 1) / count};
}

class GlobalBatchSampler {
 public:
  // InvalidArgument when global_batch < 1, dataset_size < 1, or global_batch > dataset_size
  // (the message, "batch size larger than the data", names both numbers), or when `layout`
  // has shards whose sizes do not add up to dataset_size or a window below 1.
  GlobalBatchSampler(int64_t dataset_size, int64_t global_batch, uint64_t seed,
                     ShardLayout layout = {});

  int64_t dataset_size() const { return dataset_size_; }
  int64_t global_batch() const { return global_batch_; }
  uint64_t seed() const { return seed_; }

  // Full global batches per epoch: dataset_size / global_batch, at least 1.
  int64_t steps_per_epoch() const;

  // The epoch global step `step` (>= 0, counted from the start of training) falls in.
  int64_t epoch_of(int64_t step) const;

  // Indices (into the dataset) of the examples worker `rank` of `world` uses at global step
  // `step`: slice `rank` of size global_batch / world of that step's global batch.
  // Concatenating the slices of ranks 0..world-1 gives indices(step, 0, 1).
  // InvalidArgument when step < 0, world < 1, rank outside [0, world), or global_batch is not
  // divisible by world (the message names both).
  std::vector<int64_t> indices(int64_t step, int rank, int world) const;

  // Indices of examples [part.begin, part.end) of global step `step`'s batch: what a rank
  // whose share is `part` uses. indices(step, r, W) == slice(step, {r·B/W, (r+1)·B/W}).
  // InvalidArgument when step < 0 or the slice is not inside [0, global_batch).
  std::vector<int64_t> slice(int64_t step, BatchSlice part) const;

  // The permutation of 0..dataset_size-1 epoch `epoch` visits the data in.
  const std::vector<int64_t>& permutation(int64_t epoch) const;

 private:
  int64_t dataset_size_;
  int64_t global_batch_;
  uint64_t seed_;
  ShardLayout layout_;
  // Cache of the most recently used epoch's permutation; steps are consumed in order, so it is
  // recomputed once per epoch.
  mutable int64_t cached_epoch_ = -1;
  mutable std::vector<int64_t> cached_perm_;
};

// The examples at `idx`: {inputs[idx], targets[idx]}, copies (dataset.get(idx)). Indices out of
// range throw (LibTorch's c10::Error for a TensorDataset). An empty `idx` gives tensors with a
// first dimension of 0.
std::pair<at::Tensor, at::Tensor> gather(const Dataset& dataset, const std::vector<int64_t>& idx);

}  // namespace krab::data
