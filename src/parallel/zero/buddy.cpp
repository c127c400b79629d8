#include "parallel/zero/buddy.h"

#include <torch/torch.h>

#include <exception>

#include "core/errors.h"
#include "parallel/zero/offload.h"

namespace krab::parallel::zero {

int buddy_rank(int rank, int world) { return world < 2 ? -1 : (rank + 1) % world; }

int ward_shard(int rank, int world) { return world < 2 ? -1 : (rank + world - 1) % world; }

ShardBuddy::ShardBuddy(const engine::ShardLayout& layout, int stage, int rank,
                       std::vector<at::Tensor> ward_values, bool values_owned,
                       const OptimizerFactory& make_optimizer)
    : layout_(layout),
      rank_(rank),
      ward_(ward_shard(rank, layout.world())),
      values_owned_(values_owned),
      values_(std::move(ward_values)),
      grads_(layout.num_units()) {
  KRAB_CHECK_ARG(layout.world() >= 2, "replicate_shards: a group of ", layout.world(),
                 " has no buddy rank to keep a copy on");
  KRAB_CHECK(static_cast<int>(values_.size()) == layout.num_units(),
             "ShardBuddy: one ward tensor per unit expected, got ", values_.size());
  for (int u = 0; u < layout.num_units(); ++u)
    KRAB_CHECK(values_[u].numel() == layout.shard_numel(u), "ShardBuddy: the ward of unit ", u,
               " has ", values_[u].numel(), " elements, its shards ", layout.shard_numel(u));
  optimizers_ = std::make_unique<ShardOptimizers>(values_, make_optimizer);
  state_.layout = &layout_;
  state_.stage = stage;
  state_.values = values_;
  state_.optimizers = optimizers_->pointers();
}

ShardBuddy::~ShardBuddy() = default;

// The sends and recvs of all units are started before any is waited for: with W = 2 both
// neighbours are the same rank, and each rank must have posted its recvs before waiting on its
// sends for the pair to make progress in either order.
void ShardBuddy::exchange(comm::Communicator& comm, const std::vector<at::Tensor>& own_grads) {
  KRAB_CHECK(static_cast<int>(own_grads.size()) == layout_.num_units(),
             "ShardBuddy: one gradient shard per unit expected, got ", own_grads.size());
  const int to = buddy_rank(rank_, layout_.world());
  std::vector<comm::WorkPtr> works;
  std::vector<at::Tensor> used;  // what the ops read and write
  int64_t bytes = 0;
  for (int u = 0; u < layout_.num_units(); ++u) {
    grads_[u] = at::Tensor();
    if (layout_.shard_numel(u) == 0) continue;  // no shard, no message (both ends agree)
    KRAB_CHECK(own_grads[u].defined() && own_grads[u].numel() == layout_.shard_numel(u),
               "ShardBuddy: unit ", u, "'s gradient shard is missing or of another size");
    grads_[u] = torch::empty_like(own_grads[u]);
    bytes += static_cast<int64_t>(grads_[u].nbytes());
    works.push_back(comm.recv(grads_[u], ward_, kBuddyTag + u));
    works.push_back(comm.send(own_grads[u], to, kBuddyTag + u));
    used.push_back(own_grads[u]);
    used.push_back(grads_[u]);
  }
  grad_bytes_peak_ = std::max(grad_bytes_peak_, bytes);
  try {
    finish(works, std::move(used));
  } catch (...) {
    for (auto& g : grads_) g = at::Tensor();  // a half-received gradient is never stepped
    throw;
  }
}

// Two rounds: a buddy learns from the header whether its ward has optimizer state (none before
// the first step) before it can post the receives of the fields. Each unit's messages share
// one tag; messages of one tag between one pair arrive in order.
void ShardBuddy::resync(comm::Communicator& comm, const engine::ShardedState& own) {
  const int to = buddy_rank(rank_, layout_.world());
  const int units = layout_.num_units();
  std::vector<TensorState> mine(units);
  std::vector<at::Tensor> headers(units);
  std::vector<comm::WorkPtr> works;
  std::vector<at::Tensor> used;
  for (int u = 0; u < units; ++u) {
    if (layout_.shard_numel(u) == 0) continue;
    mine[u] = get_tensor_state(*own.optimizers.at(u), own.values.at(u));
    KRAB_CHECK(!mine[u].present ||
                   static_cast<int>(mine[u].fields.size()) == optimizer_fields(*own.optimizers[u]),
               "ShardBuddy: unit ", u, "'s optimizer state has another number of fields");
    const at::Tensor header =
        torch::tensor({int64_t{mine[u].present ? 1 : 0}, mine[u].step}, at::kLong);
    headers[u] = torch::empty({2}, at::kLong);
    works.push_back(comm.recv(values_[u], ward_, kBuddyTag + u));
    works.push_back(comm.recv(headers[u], ward_, kBuddyTag + u));
    works.push_back(comm.send(own.values[u], to, kBuddyTag + u));
    works.push_back(comm.send(header, to, kBuddyTag + u));
    used.insert(used.end(), {values_[u], headers[u], own.values[u], header});
  }
  finish(works, std::move(used));
  works.clear();
  std::vector<TensorState> theirs(units);
  const int fields = optimizer_fields(optimizers_->at(0));  // one optimizer type for all units
  for (int u = 0; u < units; ++u) {
    if (layout_.shard_numel(u) == 0) continue;
    theirs[u].present = headers[u][0].item<int64_t>() != 0;
    theirs[u].step = headers[u][1].item<int64_t>();
    for (int f = 0; theirs[u].present && f < fields; ++f) {
      theirs[u].fields.push_back(torch::empty_like(values_[u]));
      works.push_back(comm.recv(theirs[u].fields.back(), ward_, kBuddyTag + u));
      used.push_back(theirs[u].fields.back());
    }
    for (const at::Tensor& f : mine[u].fields) {
      works.push_back(comm.send(f, to, kBuddyTag + u));
      used.push_back(f);
    }
  }
  finish(works, std::move(used));
  for (int u = 0; u < units; ++u)
    set_tensor_state(optimizers_->at(u), values_[u], std::move(theirs[u]));
}

void ShardBuddy::finish(std::vector<comm::WorkPtr>& works, std::vector<at::Tensor> used) {
  std::exception_ptr first;
  for (auto& w : works) try {
      w->wait();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  if (first) {
    // The tensors stay referenced for an aborted group's op that may still read or write them.
    held_ = std::move(used);
    std::rethrow_exception(first);
  }
  held_.clear();
}

void ShardBuddy::step(double lr) {
  for (int u = 0; u < layout_.num_units(); ++u) values_[u].mutable_grad() = grads_[u];
  optimizers_->step(lr);  // a unit whose value has no gradient is not stepped
  for (int u = 0; u < layout_.num_units(); ++u) {
    values_[u].mutable_grad() = at::Tensor();
    grads_[u] = at::Tensor();
  }
}

WardBytes ShardBuddy::bytes() const {
  WardBytes b;
  if (values_owned_)
    for (const auto& v : values_) b.values += static_cast<int64_t>(v.nbytes());
  b.grads = grad_bytes_peak_;
  b.optimizer = optimizers_->state_bytes();
  return b;
}

}  // namespace krab::parallel::zero
