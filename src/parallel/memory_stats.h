// Bytes an engine holds, measured from its tensors, for Engine::memory() and the report's
// `memory` field (docs/design/zero-sharding.md §5.3). Tensors that share a storage (a parameter
// that is a view into a unit's flat, an optimizer's state over a shard view) are counted once:
// what is summed is each distinct StorageImpl's nbytes(), the memory that is actually held.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace torch::optim {
class Optimizer;
}

namespace krab::parallel {

// Σ nbytes over the distinct storages of the defined tensors in `tensors`.
int64_t storage_bytes(const std::vector<at::Tensor>& tensors);

// The state tensors of `optimizer` (SGD's momentum buffers, Adam's and AdamW's moments and
// amsgrad maxima), in parameter order. A state of another optimizer type is not listed.
std::vector<at::Tensor> optimizer_state_tensors(torch::optim::Optimizer& optimizer);

// Defined .grad tensors of `params`.
std::vector<at::Tensor> gradients(const std::vector<at::Tensor>& params);

}  // namespace krab::parallel
