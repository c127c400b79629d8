#include "data/sampler.h"

#include <torch/torch.h>

#include "core/errors.h"
#include "data/rng.h"

namespace krab::data {

GlobalBatchSampler::GlobalBatchSampler(int64_t dataset_size, int64_t global_batch, uint64_t seed)
    : dataset_size_(dataset_size), global_batch_(global_batch), seed_(seed) {
  KRAB_CHECK_ARG(dataset_size >= 1, "dataset is empty (size ", dataset_size, ")");
  KRAB_CHECK_ARG(global_batch >= 1, "global batch size must be at least 1, got ", global_batch);
  KRAB_CHECK_ARG(global_batch <= dataset_size, "batch size larger than the data: global batch ",
                 global_batch, " > dataset size ", dataset_size);
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
    cached_perm_ = random_permutation(dataset_size_, rng);
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
  KRAB_CHECK_ARG(part.begin >= 0 && part.begin <= part.end && part.end <= global_batch_,
                 "slice [", part.begin, ", ", part.end, ") outside the global batch of ",
                 global_batch_);
  const std::vector<int64_t>& perm = permutation(epoch_of(step));
  const int64_t base = (step % steps_per_epoch()) * global_batch_;
  return std::vector<int64_t>(perm.begin() + base + part.begin, perm.begin() + base + part.end);
}

std::pair<at::Tensor, at::Tensor> gather(const TensorDataset& dataset,
                                         const std::vector<int64_t>& idx) {
  // from_blob does not own idx's memory; index_select copies before idx goes out of scope.
  const at::Tensor index = torch::from_blob(const_cast<int64_t*>(idx.data()),
                                            {static_cast<int64_t>(idx.size())}, torch::kInt64)
                               .to(dataset.inputs.device());
  return {dataset.inputs.index_select(0, index), dataset.targets.index_select(0, index)};
}

int64_t TensorDataset::size() const { return inputs.defined() ? inputs.size(0) : 0; }

}  // namespace krab::data
