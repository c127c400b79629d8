#include "data/sampler.h"

#include <torch/torch.h>

#include <algorithm>

#include "core/errors.h"
#include "data/rng.h"

namespace krab::data {

namespace {

// The two-level permutation of a sharded dataset (the header's last bullet). The caller has
// checked that the shard sizes add up to the dataset size and that there is more than one
// window.
std::vector<int64_t> windowed_permutation(const ShardLayout& layout, int64_t dataset_size,
                                          std::mt19937_64& rng) {
  const int64_t shards = static_cast<int64_t>(layout.shard_sizes.size());
  std::vector<int64_t> starts(shards, 0);
  for (int64_t s = 1; s < shards; ++s) starts[s] = starts[s - 1] + layout.shard_sizes[s - 1];
  const std::vector<int64_t> order = random_permutation(shards, rng);
  std::vector<int64_t> perm;
  perm.reserve(dataset_size);
  for (int64_t w = 0; w < shards; w += layout.window) {
    const size_t begin = perm.size();
    for (int64_t k = w; k < std::min(shards, w + layout.window); ++k)
      for (int64_t i = 0; i < layout.shard_sizes[order[k]]; ++i)
        perm.push_back(starts[order[k]] + i);
    shuffle_in_place(perm.data() + begin, static_cast<int64_t>(perm.size() - begin), rng);
  }
  return perm;
}

}  // namespace

GlobalBatchSampler::GlobalBatchSampler(int64_t dataset_size, int64_t global_batch, uint64_t seed,
                                       ShardLayout layout)
    : dataset_size_(dataset_size),
      global_batch_(global_batch),
      seed_(seed),
      layout_(std::move(layout)) {
  KRAB_CHECK_ARG(dataset_size >= 1, "dataset is empty (size ", dataset_size, ")");
  KRAB_CHECK_ARG(global_batch >= 1, "global batch size must be at least 1, got ", global_batch);
  KRAB_CHECK_ARG(global_batch <= dataset_size, "batch size larger than the data: global batch ",
                 global_batch, " > dataset size ", dataset_size);
  if (layout_.shard_sizes.empty()) return;
  int64_t total = 0;
  for (const int64_t n : layout_.shard_sizes) {
    KRAB_CHECK_ARG(n >= 0, "shard of ", n, " examples");
    total += n;
  }
  KRAB_CHECK_ARG(total == dataset_size, "shards of ", total, " examples for a dataset of ",
                 dataset_size);
  KRAB_CHECK_ARG(layout_.window >= 1, "shuffle window of ", layout_.window, " shards");
}

int64_t GlobalBatchSampler::steps_per_epoch() const { return dataset_size_ / global_batch_; }

int64_t GlobalBatchSampler::epoch_of(int64_t step) const {
  KRAB_CHECK_ARG(step >= 0, "step must be >= 0, got ", step);
  return step / steps_per_epoch();
}

const std::vector<int64_t>& GlobalBatchSampler::permutation(int64_t epoch) const {
  KRAB_CHECK_ARG(epoch >= 0, "epoch must be >= 0, got ", epoch);
  if (epoch != cached_epoch_) {
    // One independent stream per epoch, derived from (seed, epoch) alone, so jumping straight
    // to step s (resume from a checkpoint) gives the same batches as walking there.
    std::mt19937_64 rng(derive_seed(seed_, static_cast<uint64_t>(epoch)));
    const int64_t shards = static_cast<int64_t>(layout_.shard_sizes.size());
    cached_perm_ = layout_.window < shards ? windowed_permutation(layout_, dataset_size_, rng)
                                           : random_permutation(dataset_size_, rng);
    cached_epoch_ = epoch;
  }
  return cached_perm_;
}

std::vector<int64_t> GlobalBatchSampler::indices(int64_t step, int rank, int world) const {
  KRAB_CHECK_ARG(world >= 1, "world size must be >= 1, got ", world);
  KRAB_CHECK_ARG(rank >= 0 && rank < world, "rank ", rank, " outside [0, ", world, ")");
  KRAB_CHECK_ARG(global_batch_ % world == 0, "global batch ", global_batch_,
                 " is not divisible by the number of workers ", world);
  const int64_t local = global_batch_ / world;
  return slice(step, {rank * local, (rank + 1) * local});
}

std::vector<int64_t> GlobalBatchSampler::slice(int64_t step, BatchSlice part) const {
  KRAB_CHECK_ARG(step >= 0, "step must be >= 0, got ", step);
  KRAB_CHECK_ARG(part.begin >= 0 && part.begin <= part.end && part.end <= global_batch_, "slice [",
                 part.begin, ", ", part.end, ") outside the global batch of ", global_batch_);
  const std::vector<int64_t>& perm = permutation(epoch_of(step));
  const int64_t base = (step % steps_per_epoch()) * global_batch_;
  return std::vector<int64_t>(perm.begin() + base + part.begin, perm.begin() + base + part.end);
}

std::pair<at::Tensor, at::Tensor> gather(const Dataset& dataset, const std::vector<int64_t>& idx) {
  return dataset.get(idx);
}

std::pair<at::Tensor, at::Tensor> TensorDataset::get(const std::vector<int64_t>& idx) const {
  // from_blob does not own idx's memory; index_select copies before idx goes out of scope.
  const at::Tensor index = torch::from_blob(const_cast<int64_t*>(idx.data()),
                                            {static_cast<int64_t>(idx.size())}, torch::kInt64)
                               .to(inputs.device());
  return {inputs.index_select(0, index), targets.index_select(0, index)};
}

int64_t TensorDataset::size() const { return inputs.defined() ? inputs.size(0) : 0; }

int64_t TensorDataset::resident_bytes() const {
  return static_cast<int64_t>((inputs.defined() ? inputs.nbytes() : 0) +
                              (targets.defined() ? targets.nbytes() : 0));
}

}  // namespace krab::data
