// A training set made of tensor files ("shards") read on demand, so that a data set larger than
// a worker's memory trains.
//
// Opening reads each shard's header and labels only (tensor_file.h); a shard's examples are
// read the first time a batch needs one of them and kept in a least-recently-used cache of at
// most `cache_bytes`. Memory held for examples is therefore bounded by cache_bytes (plus the
// batch being assembled), whatever the size of the data set.
//
// Random access over all examples would make every batch touch most shards and the cache
// reread the whole data set at every step. The sampler avoids that through layout(): with
// shard sizes and a window of w shards it visits the data window by window (data/sampler.h),
// so that a stretch of batches touches only the w shards of one window (two at a window's
// edge). The window is chosen so that w shards fit in the cache: each shard is then read once
// per epoch by each worker. The price is a less thorough shuffle: examples of different
// windows never share a batch within an epoch (the shard order and the windows change every
// epoch). A window of every shard gives the uniform shuffle of an in-memory data set, and then
// the same batches as one file with the same examples in the same order.
//
// Thread-safe: get() serialises on an internal mutex (a worker's one training thread is the
// expected caller).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <list>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/tensor_file.h"

namespace krab::data {

class ShardedDataset final : public Dataset {
 public:
  // The shards `files` (in index order) whose headers are `infos` (inspect_tensor_file, same
  // order; every shard with the same per-example shapes and dtypes, checked by the caller).
  // `window` >= 1 shards per shuffle window. `largest_label`: the largest class label of every
  // shard (the loader read them all at opening), -1 for float targets. InvalidArgument naming
  // the file when one shard is larger than cache_bytes, or naming data.shuffle_window when
  // `window` of the largest shards do not fit in it.
  ShardedDataset(std::vector<std::string> files, std::vector<TensorFileInfo> infos,
                 int64_t cache_bytes, int64_t window, int64_t largest_label);

  int64_t size() const override { return size_; }

  // Reads the shards the indices fall in that are not cached, evicting the least recently used
  // ones first so that the cache never holds more than cache_bytes. Shards already cached are
  // used first, so that a batch at a window's edge does not evict a shard it still needs.
  // InvalidArgument when an index is outside [0, size()); CorruptData naming the file when a
  // shard no longer holds what its header said at opening (changed on disk).
  std::pair<at::Tensor, at::Tensor> get(const std::vector<int64_t>& idx) const override;

  // min(cache_bytes, the bytes of every shard).
  int64_t resident_bytes() const override;
  ShardLayout layout() const override;

  // The largest class label of the whole training split (-1 for float targets), for checks
  // that would otherwise need every label in memory (a model's number of outputs).
  int64_t largest_label() const { return largest_label_; }

  // Shard reads so far, and bytes of examples cached now: for tests and logs.
  int64_t loads() const;
  int64_t cached_bytes() const;

 private:
  struct Entry {
    TensorDataset data;
    std::list<int64_t>::iterator lru_pos;
  };

  // The shard, read (and cached) if needed. Caller holds mu_.
  const TensorDataset& shard(int64_t s) const;
  int64_t shard_of(int64_t index) const;

  std::vector<std::string> files_;
  std::vector<TensorFileInfo> infos_;
  std::vector<int64_t> starts_;  // index of each shard's first example; size() at the end
  int64_t size_ = 0;
  int64_t cache_bytes_;
  int64_t window_;
  int64_t largest_label_;

  mutable std::mutex mu_;
  mutable std::map<int64_t, Entry> cache_;
  mutable std::list<int64_t> lru_;  // most recently used first
  mutable int64_t cached_bytes_ = 0;
  mutable int64_t loads_ = 0;
};

}  // namespace krab::data
