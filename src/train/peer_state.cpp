#include "train/peer_state.h"

#include <torch/torch.h>

#include <cstring>

#include "comm/communicator.h"
#include "core/errors.h"
#include "models/model.h"

namespace krab::train {

std::string broadcast_bytes(comm::Communicator& comm, std::string bytes) {
  auto len = torch::tensor({static_cast<int64_t>(bytes.size())}, torch::kInt64);
  comm.broadcast(len, 0)->wait();
  auto buf = torch::empty({len.item<int64_t>()}, torch::kUInt8);
  if (comm.rank() == 0) std::memcpy(buf.data_ptr(), bytes.data(), bytes.size());
  comm.broadcast(buf, 0)->wait();
  return std::string(static_cast<const char*>(buf.data_ptr()), buf.numel());
}

int64_t transfer_replica(comm::Communicator& group, const engine::TrainState& state,
                         const CheckpointMeta& meta, bool receiving) {
  KRAB_CHECK(state.model != nullptr && state.optimizer != nullptr,
             "transfer_replica: the engine holds no full replica");
  std::string bytes;
  if (group.rank() == 0) bytes = encode_checkpoint(meta, *state.model, *state.optimizer);
  bytes = broadcast_bytes(group, std::move(bytes));
  if (!receiving) return meta.step;
  return decode_checkpoint(bytes, "rank 0's state", meta, *state.model, *state.optimizer).step;
}

}  // namespace krab::train
