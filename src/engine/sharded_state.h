// ShardedState: what a sharded (ZeRO) engine hands the training loop for checkpoints — this
// rank's shard of every unit's flat parameters and of the optimizer state over them
// (docs/design/zero-sharding.md §1.3, §4). The layout (engine/shard_layout.h) says which
// parameter elements a shard holds, so a checkpoint written at one world size, stage or wrap
// can be read back at any other through parameter names.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "engine/shard_layout.h"

namespace torch::optim {
class Optimizer;
}

namespace krab::engine {

struct ShardedState {
  const ShardLayout* layout = nullptr;
  int stage = 0;  // parallel.zero_stage: 1, 2 or 3
  // values[u]: fp32 [layout.shard_numel(u)], this rank's elements of unit u's flat (padding
  // included, always 0). Stages 1-2: a view into the parameters' own flat storage; stage 3:
  // the master shard. Writing into it (a restore) changes what the next step starts from once
  // the engine's after_restore() has run.
  std::vector<at::Tensor> values;
  // optimizers[u]: the optimizer that steps values[u] (one torch optimizer over that one
  // tensor; its state for values[u] is this rank's optimizer state of unit u).
  std::vector<torch::optim::Optimizer*> optimizers;
};

}  // namespace krab::engine
